"""``moquad plot RUN``: loss, learning rate and the Fig. 4 rank curves of a run, to one PNG.

Per-step values are noisy at small batches: each noisy curve is drawn faint with its exponential moving average
(debiased, :func:`ema`) on top; epochs are marked (faint lines, a top axis in epochs); the rank panel says how many
candidates each anchor ranks (:func:`candidates`) and draws the chance level, the mean rank of a random order.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moquad.train.log import read_log


def ema(values: np.ndarray | list[float], window: int) -> np.ndarray:
    """Debiased exponential moving average, beta = 1 - 1/window: ``s_t = sum_i beta^(t-i) (1-beta) x_i /
    (1 - beta^(t+1))`` (TensorBoard's smoothing: the first points are not pulled towards 0)."""
    x = np.asarray(values, dtype=np.float64)
    beta, out, s = 1.0 - 1.0 / max(1, window), np.empty(len(x)), 0.0
    for t, v in enumerate(x):
        s = beta * s + (1.0 - beta) * v
        out[t] = s / (1.0 - beta ** (t + 1))
    return out


def smoothing_window(points: int) -> int:
    """The EMA window for a curve of ``points`` values: a 15th of the run, between 1 and 25 steps (a longer one lags
    behind the fast first drop of the loss)."""
    return int(min(25, max(1, round(points / 15))))


def _run_method(run_dir: Path) -> tuple[Any, Any] | None:
    """(config, method row configured by it) of a run, from its ``config.yaml``; None without one (or a method no
    longer in the table)."""
    from moquad.config import PretrainConfig, update
    from moquad.train.methods import METHODS

    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    cfg = update(PretrainConfig(), yaml.safe_load(path.read_text()) or {})
    return (cfg, METHODS[cfg.method].configured(cfg)) if cfg.method in METHODS else None


def candidates(run_dir: Path, mode: str) -> int | None:
    """How many candidates an anchor ranks in a step of ``mode`` (the stage's count,
    :meth:`moquad.train.methods.Method.candidates`: the batch's other views, or with a momentum encoder its keys
    and the queue), from the run's ``config.yaml``; None when the run has none."""
    found = _run_method(run_dir)
    stage = found[1].named(mode) if found else None
    return None if stage is None else found[1].candidates(stage, found[0])


def stage_kinds(run_dir: Path, records: list[dict[str, Any]]) -> list[str | None]:
    """Each record's stage kind (``moquad.train.methods.WARMUP`` / ``MAIN``): logged since runs record it, else
    looked up from the run's method row by the record's ``mode``."""
    found = _run_method(run_dir)

    def kind(r: dict[str, Any]) -> str | None:
        if "stage" in r:
            return r["stage"]
        stage = found[1].named(r.get("mode", "")) if found else None
        return stage.kind if stage else None

    return [kind(r) for r in records]


def _curve(ax: Any, x: list[int], y: list[float], label: str | None, color: str, window: int) -> None:
    """The raw per-step values faint, their EMA solid."""
    ax.plot(x, y, lw=0.8, color=color, alpha=0.25)
    ax.plot(x, ema(y, window), lw=1.6, color=color, label=label)


def _rank_panel(ax: Any, run_dir: Path, records: list[dict[str, Any]], series: Any, window: int) -> None:
    """Mean ranks of AD-Pos and Intra-Negs, the chance level of each stage (mode) of the run."""
    for (key, label), color in zip((("rank_ad_pos", "AD-Pos"), ("rank_intra_neg", "Intra-Negs")), ("C0", "C3")):
        x, y = series(key)
        if x:
            _curve(ax, x, y, label, color, window)
    counts: dict[str, int | None] = {}
    for mode in dict.fromkeys(r.get("mode", "") for r in records):
        counts[mode] = candidates(run_dir, mode)
        steps = [r["step"] for r in records if r.get("mode", "") == mode]
        if counts[mode] is not None and steps:
            ax.hlines((counts[mode] + 1) / 2, min(steps) - 1, max(steps), colors="grey", linestyles=":", lw=1.2,
                      label="chance: (candidates + 1) / 2" if len(counts) == 1 else None)
    known = {m: c for m, c in counts.items() if c is not None}
    of = ", ".join(f"{c} ({m})" if len(known) > 1 else str(c) for m, c in known.items()) or "? (no config.yaml)"
    ax.set(title=f"mean rank among {of} candidates (1 = nearest)", xlabel="step", ylabel="mean rank")


def _epoch_marks(axes: Any, records: list[dict[str, Any]]) -> None:
    """Faint lines at epoch ends and an epoch axis on top (the last logged step of each epoch is its last)."""
    ends = [a["step"] for a, b in zip(records, records[1:]) if b.get("epoch", 0) > a.get("epoch", 0)]
    if not ends:
        return
    spe = ends[0] / (records[0].get("epoch", 0) + 1)
    every = max(1, math.ceil(len(ends) / 30))  # at most ~30 lines
    for ax in axes:
        for s in ends[every - 1 :: every]:
            ax.axvline(s, color="grey", lw=0.5, alpha=0.3)
        top = ax.secondary_xaxis("top", functions=(lambda s: s / spe, lambda e: e * spe))
        top.set_xlabel("epoch", fontsize=8)
        top.tick_params(labelsize=7)


def plot_run(run_dir: str | Path, out_png: str | Path | None = None) -> Path:
    """Draw loss / lr / mean ranks of AD-Pos and Intra-Negs against step; default ``RUN/curves.png``."""
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    fig = run_figure(run_dir)
    out = Path(out_png) if out_png else run_dir / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_figure(run_dir: Path) -> Any:
    """The figure of :func:`plot_run` (a matplotlib Figure: loss, learning rate, ranks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(run_dir / "log.jsonl")
    if not records:
        raise FileNotFoundError(
            f"no training log at {run_dir / 'log.jsonl'}; pass the folder of a pretrain run"
        )

    def series(key: str) -> tuple[list[int], list[float]]:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None and not math.isnan(r[key])]
        return [p[0] for p in pts], [p[1] for p in pts]

    window = smoothing_window(len(records))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    x, y = series("loss")
    _curve(axes[0], x, y, f"EMA, window {window} steps", "C0", window)
    axes[0].set(title="loss (faint: per step)", xlabel="step")
    axes[0].legend(fontsize=8)
    x, y = series("lr")
    axes[1].plot(x, y, lw=1.2)
    axes[1].set(title="learning rate", xlabel="step")
    _rank_panel(axes[2], run_dir, records, series, window)
    # mark the switch from the warm-up stage to the main one
    from moquad.train.methods import WARMUP

    kinds = stage_kinds(run_dir, records)
    switch = [r["step"] for a, r, ka, kr in zip(records, records[1:], kinds, kinds[1:]) if ka == WARMUP != kr]
    for ax in axes:
        for s in switch:
            ax.axvline(s, color="black", ls="--", lw=0.8, label="end of warm-up" if ax is axes[2] else None)
    axes[2].legend(fontsize=8, loc="center right")
    _epoch_marks(axes, records)
    fig.suptitle(f"{run_dir.name}: {len(records)} logged steps; thin lines: per step, thick: EMA over {window} "
                 "steps; grey verticals: epoch ends", fontsize=10)
    fig.tight_layout()
    return fig
