"""The motion report (``moquad motion``) over a ladder's checkpoints, every seed: evaluation only, no training.

For each family and seed of a ``experiments/motion_ladder.py --out DIR`` folder, the report runs on the test split
of that family's data (``DIR/data/FAMILY/seedS/shards``) with one encoder per variant
(``DIR/runs/FAMILY/seedS/VARIANT/checkpoints/last.pt``; a variant without a checkpoint there, e.g. ``supervised``,
is left out). A ``moquad quickstart --out DIR`` folder works too: its family and seed are the quickstart's, its
encoders ``random``, ``simclr`` and ``moquad``, and the record also holds the quickstart's own comparison
(``DIR/comparison.json``: the three measures of each network) as the table ``comparison``. The record (``docs/results/motion_evidence.json``, ``--record``)
holds a table per family (the mean ± std over the seeds of the report's measures) and every run's figures; ``--plot-seed S`` also writes that seed's
motion report (``OUT/FAMILY/motion.png``, ``motion.json``) of the first family.

    python experiments/motion_evidence.py DIR --families types directions camera --seeds 0 1 2 \\
        --variants random demo-simclr demo-moquad demo-moco demo-moco_moquad --out runs/motion_evidence
    python experiments/motion_evidence.py runs/quickstart --variants random simclr moquad \\
        --record docs/results/motion_demo.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from motion_ladder import data_dir, run_dir

from moquad.record import Record, add_argument

COLUMNS = (  # (column, value of one encoder's report, scale, digits)
    ("arrow of time top-1 %", lambda r: r["arrow_of_time_top1"], 100, 1),
    ("reversed / crop", lambda r: r["ratio_to_crop"]["reversed"], 1, 2),
    ("speed top-1 %", lambda r: r["speed_top1"], 100, 1),
    ("4x / crop", lambda r: r["ratio_to_crop"]["speed4"], 1, 2),
    ("mirror / crop", lambda r: r["ratio_to_crop"]["mirror"], 1, 2),
    ("still cosine", lambda r: r["appearance_share"], 1, 2),  # the appearance share (narrow enough a header)
)


def quickstart(folder: Path) -> tuple[str, int] | None:
    """(family, seed) of a ``moquad quickstart`` folder, or None for a ladder folder."""
    stamp = folder / "quickstart.json"
    if not stamp.is_file():
        return None
    made = json.loads(stamp.read_text())
    return made.get("kind", "types"), int(made.get("seed", 0))


def report(ladder: Path, family: str, seed: int, variants: list[str], threads: int) -> dict:
    """The motion report of one family and seed's checkpoints (the variants that have one)."""
    from moquad.eval.motion import load_encoder, motion_report

    demo = quickstart(ladder) is not None
    ckpts = {v: (ladder / v if demo else run_dir(ladder, family, seed, v)) / "checkpoints" / "last.pt"
             for v in variants}
    specs = [f"{v}={ckpt}" for v, ckpt in ckpts.items() if ckpt.is_file()]
    if not specs:
        raise SystemExit(f"error: no checkpoint of {', '.join(variants)} under {ladder}; run the ladder first")
    data = (ladder / "data" if demo else data_dir(ladder, family, seed)) / "shards"
    return motion_report(data, [load_encoder(s) for s in specs], split="test", show=False, threads=threads)


def summary(by_seed: dict[int, dict], variants: list[str], columns: tuple = COLUMNS) -> list[list[str]]:
    """One family's rows: per variant, the mean ± std over seeds of each column."""
    rows = []
    for v in variants:
        results = [r["encoders"][v] for r in by_seed.values() if v in r["encoders"]]
        if not results:
            continue
        cells = []
        for _, fn, scale, digits in columns:
            vals = [scale * fn(r) for r in results]
            std = f" ± {statistics.stdev(vals):.{digits}f}" if len(vals) > 1 else ""  # one seed: its value
            cells.append(f"{statistics.mean(vals):.{digits}f}{std}")
        rows.append([f"`{v}`", *cells])
    return rows


def comparison(rec: Record, folder: Path) -> None:
    """The quickstart's comparison table (its ``comparison.json``) into ``rec``."""
    from moquad.quickstart import METRICS

    made = json.loads((folder / "comparison.json").read_text())
    chance = made.pop("chance_top1")
    rec.figures["comparison"] = made
    rec.table("comparison", ["network", *(f"{label} %" for label in METRICS.values()), "hit@5 %"],
              [[name, *(f"{100 * r[m]:.1f}" for m in METRICS), f"{100 * r['hit@5']:.1f}"] for name, r in made.items()],
              title=f"The quickstart's comparison (its comparison.json), chance {100 * chance:.0f} %",
              notes=[f"Chance is {100 * chance:.0f} %. `moquad quickstart` measured these on its test split; the "
                     "record holds its `comparison.json`."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ladder", type=Path, help="a motion_ladder.py --out folder")
    ap.add_argument("--families", nargs="+", default=["types"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variants", nargs="+", default=["random", "demo-simclr", "demo-moquad"])
    ap.add_argument("--out", type=Path, default=Path("runs/motion_evidence"), help="where --plot-seed writes")
    ap.add_argument("--plot-seed", type=int, default=None, help="write this seed's report and plot of the first family")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_argument(ap, "motion_evidence")
    args = ap.parse_args()
    rec = Record("motion_evidence")
    demo = quickstart(args.ladder)
    if demo:
        args.families, args.seeds = [demo[0]], [demo[1]]
    runs: dict[str, dict[int, dict]] = {}
    for family in args.families:
        for seed in args.seeds:
            result = report(args.ladder, family, seed, args.variants, args.threads)
            runs.setdefault(family, {})[seed] = result
            print(f"{family} seed {seed}: {', '.join(result['encoders'])} in {result['seconds']:.0f} s", flush=True)
            if seed == args.plot_seed and family == args.families[0]:
                from moquad.eval.motion import write_report

                write_report(result, args.out / family)
    rec.figures["runs"] = {f: {str(s): {v: {k: x for k, x in e.items() if k != "encoder"}
                                        for v, e in r["encoders"].items()} for s, r in by.items()}
                           for f, by in runs.items()}
    if demo:
        comparison(rec, args.ladder)
    for family, by_seed in runs.items():
        first = next(iter(by_seed.values()))
        rec.figures["protocol"] = first["protocol"]
        seeds = ", ".join(map(str, by_seed))
        # a ladder's variant names are long: its tables leave out the arrow-of-time top-1, at chance on every
        # synthetic family (none has a physical arrow of time), so they fit the documentation's column
        columns = COLUMNS if demo else COLUMNS[1:]
        rec.table(family, ["encoder", *(c for c, *_ in columns)], summary(by_seed, args.variants, columns),
                  title=f"The {family} family: the motion report on the test split ({first['data']['videos']} videos "
                        f"per seed), " + (f"mean ± std over seeds {seeds}" if len(by_seed) > 1 else f"seed {seeds}"))
    rec.write(args.record)


if __name__ == "__main__":
    main()
