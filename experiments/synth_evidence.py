"""Evidence on two synthetic motion families, three measures, several seeds: one command.

For each family (``moquad synth --kind types``: classes are motion TYPES; ``--kind directions``: classes are
the direction or sense of ONE motion type, with class-free camera drift and 1/f textures) and each seed it
runs the quickstart pipeline: random init, the SimCLR base (the ladder's base rung: MoQuad's sampling and
loss, no quadruple parts) and MoQuad pre-trained with the same budget on the tiny backbone, then three
measures of the frozen features on the test split: retrieval hit@1 (test queries vs the train gallery),
DINO's weighted kNN top-1 and the fast linear probe's top-1. Prints mean +- std over seeds, writes
``evidence.json`` and the paper's Fig. 4 diagnostic per family (``ranks_<kind>.png``).

    python experiments/synth_evidence.py --out runs/evidence                    # both families, seeds 0 1 2
    python experiments/synth_evidence.py --out runs/ev --kinds directions --seeds 0 --epochs 120

The settings are the quickstart's (``train/cpu_demo.yaml`` and ``eval/cpu_demo.yaml``). The table and every run's
figures also go to ``docs/results/synth_evidence.json`` (``--record``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moquad.quickstart import METRICS, quickstart
from moquad.record import Record, add_argument
from moquad.train.log import read_log


def plot_ranks(runs: list[Path], out: Path, title: str) -> None:
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
    ax.set_xlabel("step")
    ax.set_ylabel("mean rank among 63 candidates (1 = nearest)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def table(results: dict, seeds: list[int]) -> str:
    lines = [f"| family | method | {' | '.join(METRICS.values())} |", "|---|---|" + "---:|" * len(METRICS)]
    for kind, methods in results.items():
        for method, vals in methods.items():
            cells = []
            for m in METRICS:
                v = [100 * x for x in vals[m]]
                cells.append(f"{statistics.mean(v):.1f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.1f}")
            lines.append(f"| {kind} | {method} | " + " | ".join(cells) + " |")
    return f"mean ± std over seeds {seeds} (%):\n" + "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/evidence")
    ap.add_argument("--kinds", nargs="+", default=["types", "directions"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=None, help="default: the quickstart's")
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--backbone", default=None, help="default: the quickstart's (tiny)")
    add_argument(ap, "synth_evidence")
    args = ap.parse_args()
    rec = Record("synth_evidence")
    out = Path(args.out)
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for kind in args.kinds:
        for seed in args.seeds:
            res = quickstart(out / kind / f"seed{seed}", seed=seed, backbone=args.backbone, epochs=args.epochs,
                             per_class=args.per_class, kind=kind)
            for method, r in res.items():
                for m in METRICS:
                    results.setdefault(kind, {}).setdefault(method, {}).setdefault(m, []).append(r[m])
        plot_ranks([out / kind / f"seed{s}" / "moquad" for s in args.seeds], out / f"ranks_{kind}.png",
                   f"Fig. 4 diagnostic, {kind} family (one line per seed)")
    text = table(results, args.seeds)
    print("\n" + text)
    (out / "evidence.json").write_text(json.dumps({"seeds": args.seeds, "results": results}, indent=2))
    (out / "evidence.md").write_text(text + "\n")
    print(f"wrote {out / 'evidence.json'}, {out / 'evidence.md'} and {out}/ranks_*.png")
    rec.figures.update(seeds=args.seeds, results=results)
    rec.table("evidence", ["family", "method", "seeds", *METRICS.values()],
              [[kind, method, len(args.seeds), *(f"{statistics.mean(100 * x for x in vals[m]):.1f} ± "
                                                 f"{statistics.stdev(100 * x for x in vals[m]) if len(vals[m]) > 1 else 0:.1f}"
                                                 for m in METRICS)]
               for kind, methods in results.items() for method, vals in methods.items()], align="llrrrr", show=False,
              title="Mean ± std over seeds (%)")
    rec.write(args.record)


if __name__ == "__main__":
    main()
