"""The attentive probe against the linear probe on the same frozen features, on the synthetic motion families.

Reads the networks a motion ladder trained (``experiments/motion_ladder.py --out LADDER``: one folder per family,
seed and variant, and the shards each was trained on) and evaluates each with the demo's test views
(``eval/cpu_demo.yaml``: 5 clips of 8 frames at 32 px, 1 crop) by

- ``moquad linear --fast``: logistic regression on the video feature (the pooled feature averaged over the views);
- the attentive probe (:func:`moquad.eval.attentive.attentive`) on the tokens of the same network and views (the
  tiny CNN's last feature map, whose global average IS the pooled feature) at two depths: one cross-attention
  block (V-JEPA's probe, Bardes et al. 2024) and four blocks (V-JEPA 2's, ``configs/eval/vitl``), with the rest of
  ``eval/cpu_demo.yaml``'s ``attentive`` section, fixed before any run (no selection on a test split).

Each (family, seed, network) is one line of ``OUT/rows.jsonl`` (a cut run continues); the record's table is the
mean over seeds of each probe's top-1 minus the linear probe's, with its spread.

    python experiments/motion_ladder.py --out runs/ladder --families types directions camera --seeds 0 1 2 \\
        --variants random demo-moquad
    python experiments/attentive_vs_linear.py --ladder runs/ladder --out runs/probes \\
        --variants random demo-moquad --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from motion_ladder import data_dir, load_results, run_dir

from moquad.record import Record, add_argument

# the probes compared with the linear one: name -> pooler depth (the other settings: eval/cpu_demo.yaml)
DEPTHS = {"attentive depth 1": 1, "attentive depth 4": 4}
LINEAR = "linear (fast)"


def probes(shards: Path, ckpt: Path, out: Path, seed: int) -> dict[str, float]:
    """Top-1 of the fast linear probe and of each attentive probe, same checkpoint, same views."""
    from moquad.eval.attentive import attentive
    from moquad.eval.linear import linear
    from moquad.quickstart import demo_eval_config

    cfg = dataclasses.replace(demo_eval_config(shards, ckpt, out), seed=seed)
    res = {LINEAR: linear(cfg, fast=True)["top1"]}
    for name, depth in DEPTHS.items():
        probe = dataclasses.replace(cfg, out=str(out / name.replace(" ", "_")),
                                    attentive=dataclasses.replace(cfg.attentive, depth=depth))
        res[name] = attentive(probe)["top1"]
    return res


def jobs(ladder: Path, families: list[str], seeds: list[int], variants: list[str]) -> list[tuple]:
    """(family, seed, variant, shards, checkpoint) of every network the ladder has finished (its results line
    written: a run still training has a ``last.pt`` too)."""
    finished = {(r["family"], r["seed"], r["variant"]) for r in load_results(ladder / "results.jsonl")}
    found = []
    for family in families:
        for seed in seeds:
            shards = data_dir(ladder, family, seed) / "shards"
            for variant in variants:
                ckpt = run_dir(ladder, family, seed, variant) / "checkpoints" / "last.pt"
                if (family, seed, variant) in finished and ckpt.is_file():
                    found.append((family, seed, variant, shards, ckpt))
    return found


def _cell(values: list[float], sign: str = "+") -> str:
    """``mean ± std`` over seeds (the sample std, as the ladder's tables); one seed: its value alone."""
    mean = f"{statistics.mean(values):{sign}.1f}"
    return f"{mean} ± {statistics.stdev(values):.1f}" if len(values) > 1 else mean


def table(rec: Record, rows: list[dict], variants: list[str]) -> None:
    """Per family and network: the linear probe's top-1 and each attentive probe's gain over it (mean ± std)."""
    cells = []
    for family in dict.fromkeys(r["family"] for r in rows):
        for variant in variants:
            mine = [r for r in rows if (r["family"], r["variant"]) == (family, variant)]
            if not mine:
                continue
            lin = [100 * r[LINEAR] for r in mine]
            cells.append([family, variant, ",".join(str(r["seed"]) for r in mine),
                          _cell(lin, ""),
                          *(_cell([100 * (r[n] - r[LINEAR]) for r in mine]) for n in DEPTHS)])
    columns = ["family", "network", "seeds", "linear top-1", "depth 1 − linear", "depth 4 − linear"]
    rec.table("gains", columns, cells, align="lllrrr",
              title="The attentive probe minus the linear probe on the same frozen network and views (top-1 points, "
                    "mean ± std over seeds)",
              notes=["Networks: the motion ladder's (`random`: the untrained tiny backbone; `demo-M`: method M "
                     "pre-trained with the demo recipe on that family and seed). 4 classes, 120 test videos: one "
                     "video is 0.8 points. The attentive probes: eval/cpu_demo.yaml's `attentive` section, depth 1 "
                     "(V-JEPA) or 4 (V-JEPA 2)."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ladder", type=Path, required=True, help="a motion ladder's --out folder")
    ap.add_argument("--out", type=Path, required=True, help="probe folders and rows.jsonl")
    ap.add_argument("--families", nargs="+", default=["types", "directions", "camera"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=["random", "demo-moquad"])
    add_argument(ap, "attentive_vs_linear")
    args = ap.parse_args()
    rec = Record("attentive_vs_linear")
    path = args.out / "rows.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    rows = load_results(path)
    done = {(r["family"], r["seed"], r["variant"]) for r in rows}
    for family, seed, variant, shards, ckpt in jobs(args.ladder, args.families, args.seeds, args.variants):
        if (family, seed, variant) in done:
            continue
        res = probes(shards, ckpt, args.out / family / f"seed{seed}" / variant, seed)
        rows.append({"family": family, "seed": seed, "variant": variant, **res})
        with path.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
        print(json.dumps(rows[-1]), flush=True)
    rows = [r for r in rows if (r["family"] in args.families and r["seed"] in args.seeds
                                and r["variant"] in args.variants)]
    table(rec, rows, args.variants)
    rec.figures["rows"] = rows
    from moquad.quickstart import demo_eval_config

    rec.figures["probe"] = dataclasses.asdict(demo_eval_config(Path(), Path(), Path()).attentive) | {"depths": DEPTHS}
    rec.write(args.record)


if __name__ == "__main__":
    main()
