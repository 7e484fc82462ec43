"""Evidence that MoQuad learns motion where SimCLR learns appearance (issue 7).

Runs the quickstart pipeline (synthetic data whose classes differ only by the type of
motion; background, object appearance, direction and speed random) for several seeds:
SimCLR and MoQuad pre-trained with the same budget on the tiny backbone, then retrieval
(test queries vs train gallery). Prints mean +- std of top-k over seeds and draws the
paper's Fig. 4 diagnostic (mean rank of the AD-Pos and of the Intra-Negs among each
anchor's candidates) from the MoQuad runs' logs.

    python benchmarks/synth_evidence.py --out runs/evidence --seeds 0 1 2            # demo budget, 60 epochs
    python benchmarks/synth_evidence.py --out runs/evidence120 --seeds 0 --epochs 120  # README row, ~20 min

The settings are the quickstart's (``moquad.quickstart.demo_pretrain_config``: tiny backbone,
8x32x32 clips, batch 16, no appearance warm-up, dilations 1 and 4; why: README "Evidence").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moquad.quickstart import KS, quickstart
from moquad.train.log import read_log


def plot_ranks(runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        rows = [r for r in read_log(run / "log.jsonl") if r.get("mode") == "moquad"]
        steps = [r["step"] for r in rows]
        kw = {"alpha": 0.8, "lw": 1}
        ax.plot(steps, [r["rank_ad_pos"] for r in rows], color="tab:green", label="AD-Pos" if i == 0 else None, **kw)
        ax.plot(steps, [r["rank_intra_neg"] for r in rows], color="tab:red", label="Intra-Negs" if i == 0 else None, **kw)
    ax.set_xlabel("step (MoQuad stage; after the appearance warm-up, if any)")
    ax.set_ylabel("mean rank of 63 candidates (1 = nearest)")
    ax.set_title("Fig. 4 diagnostic on synthetic motion data (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/evidence")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=None, help="default: the quickstart's")
    ap.add_argument("--per-class", type=int, default=None, help="default: the quickstart's")
    ap.add_argument("--backbone", default="tiny", help="tiny (CPU) or r3d_18 (GPU)")
    args = ap.parse_args()
    out = Path(args.out)
    kwargs = {k: v for k, v in (("epochs", args.epochs), ("per_class", args.per_class)) if v is not None}
    results: dict[str, dict[str, list[float]]] = {}
    for seed in args.seeds:
        res = quickstart(out / f"seed{seed}", seed=seed, backbone=args.backbone, **kwargs)
        for method, r in res.items():
            for k in KS:
                results.setdefault(method, {}).setdefault(f"top{k}", []).append(100 * r[f"top{k}"])
    print(f"\nRetrieval on synthetic motion data, {len(args.seeds)} seeds (mean +- std, %):")
    print("| method | " + " | ".join(f"top-{k}" for k in KS) + " |")
    print("|---|" + "---:|" * len(KS))
    for method, vals in results.items():
        cells = []
        for k in KS:
            v = vals[f"top{k}"]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.1f} ± {sd:.1f}")
        print(f"| {method} | " + " | ".join(cells) + " |")
    (out / "evidence.json").write_text(json.dumps(results, indent=2))
    plot_ranks([out / f"seed{s}" / "moquad" for s in args.seeds], out / "ranks.png")
    print(f"wrote {out / 'evidence.json'} and {out / 'ranks.png'}")


if __name__ == "__main__":
    main()
