"""``moquad plot RUN``: loss, learning rate and the Fig. 4 rank curves of a run, to one PNG."""

from __future__ import annotations

from pathlib import Path

from moquad.train.log import read_log


def plot_run(run_dir: str | Path, out_png: str | Path | None = None) -> Path:
    """Draw loss / lr / mean ranks of AD-Pos and Intra-Negs against step; default ``RUN/curves.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_log(run_dir / "log.jsonl")
    if not records:
        raise FileNotFoundError(
            f"no training log at {run_dir / 'log.jsonl'}; pass the folder of a pretrain run"
        )
    out = Path(out_png) if out_png else run_dir / "curves.png"

    def series(key: str) -> tuple[list[int], list[float]]:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    x, y = series("loss")
    axes[0].plot(x, y, lw=1)
    axes[0].set(title="loss", xlabel="step")
    x, y = series("lr")
    axes[1].plot(x, y, lw=1)
    axes[1].set(title="learning rate", xlabel="step")
    for key, label in (("rank_ad_pos", "AD-Pos"), ("rank_intra_neg", "Intra-Negs")):
        x, y = series(key)
        if x:
            axes[2].plot(x, y, lw=1, label=label)
    axes[2].set(title="mean rank among candidates (1 = nearest)", xlabel="step")
    axes[2].legend()
    # mark the switch from the appearance warm-up to MoQuad
    switch = [
        r["step"] for a, r in zip(records, records[1:]) if a.get("mode") == "appearance" != r.get("mode")
    ]
    for ax in axes:
        for s in switch:
            ax.axvline(s, color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
