"""The motion-option ladder: every family x variant x seed at the demo budget, one resumable command.

For each family (``moquad synth --kind``; ``camera`` needs ``--source DIR`` of real videos) and seed it makes the
demo-size data once (``SYNTH`` of the quickstart: 4 classes x 100 videos at 48 px, 48 frames), then, per variant,
pre-trains the tiny backbone with ``train/cpu_demo.yaml`` plus the variant's ``--set`` assignments and measures
the frozen features three ways (``eval/cpu_demo.yaml``: retrieval hit@1, DINO weighted kNN top-1, the fast linear
probe's top-1), exactly as ``moquad quickstart`` does. ``random`` is the untrained network; ``supervised`` trains
the same backbone and clip on the labels from random init (``moquad finetune --init random`` with the demo's
fine-tuning settings) and reports its test top-1 in every column. One JSON line per (family, seed, variant) in
``OUT/results.jsonl``, with the command, the machine, the date and the commit of its run (``record.provenance``);
finished lines are skipped, so a cut run continues. ``--table`` prints mean +- std. The docs render their ladder
tables from such a file (``docs/results/*.jsonl``).

    python experiments/motion_ladder.py --out runs/ladder --families types directions --seeds 0 \\
        --variants base paper reverse speed+reverse
    python experiments/motion_ladder.py --out runs/ladder --table
    python experiments/motion_ladder.py --out runs/ladder --per-class directions   # top-1 per class
    python experiments/motion_ladder.py --out runs/ladder --compare base:paper moco:moco_moquad   # paired gains
    python experiments/motion_ladder.py --out runs/methods --families types directions --seeds 0 \
        --variants random supervised base paper moco moco_moquad moco+ad_pos moco+ad_pos+intra_neg base@b8 \
        paper@b8 moco@b8 moco_moquad@b8                                   # the two bases (docs/guides/methods.md)
    python experiments/motion_ladder.py --out runs/momentum --families types directions camera --source VIDEOS \
        --seeds 0 --variants demo-moco_moquad+slot=first demo-moco_moquad+slot=predictor \
        demo-moco_moquad+slot=split --stop runs/STOP     # the momentum slot's settings; stops once runs/STOP exists
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

from moquad import config as C
from moquad import settings
from moquad.record import provenance

# the momentum slot the momentum variants were first measured with (no predictor, keys normalised over the whole
# batch): named, so they mean the same whatever the rows adopt
FIRST_SLOT = ["predictor=false", "key_bn=batch"]
# the momentum base's sweep: factor -> its --set assignments; SWEPT: the factors (and combinations) run
SWEEP: dict[str, list[str]] = {
    "key_bn=groups": ["key_bn=groups"], "key_bn=running": ["key_bn=running"], "symmetric": ["symmetric=true"],
    "tau=0.2": ["temperature=0.2"], "m0=0.9": ["momentum=0.9"], "m0=0.996": ["momentum=0.996"],
    "predictor": ["predictor=true"], "lars_lr=4": ["lr=4.0"], "lars_lr=64": ["lr=64.0"],
    "sgd_lr=1.6": ["optimizer=sgd", "lr=1.6", "weight_decay=1e-4"],
    "sgd_lr=6.4": ["optimizer=sgd", "lr=6.4", "weight_decay=1e-4"],
    "adamw_lr=0.016": ["optimizer=adamw", "lr=0.016", "weight_decay=1e-4"],
    "queue=0": ["queue_size=0"], "queue=32": ["queue_size=32"], "queue=4096": ["queue_size=4096"],
}
SWEPT: list[tuple[str, ...]] = [(name,) for name in SWEEP] + [
    ("predictor", "key_bn=groups"), ("predictor", "key_bn=groups", "symmetric"), ("predictor", "key_bn=groups", "tau=0.2"),
    ("predictor", "key_bn=groups", "lars_lr=64"), ("predictor", "key_bn=groups", "m0=0.9"),
    ("predictor", "key_bn=groups", "tau=0.2", "lars_lr=64", "m0=0.9"),
]

# the momentum slot's settings compared on every family (docs/guides/methods.md, "Choosing the momentum defaults"),
# each on top of the demo recipe and its method's row ("demo-M" itself is the rows' defaults: the predictor and the
# keys' BatchNorm in groups of 4): the first defaults, the predictor alone, and the predictor with MoCo's one-device
# SplitBatchNorm (queries and keys in groups of 4, each key in another group than its query)
SLOTS: dict[str, list[str]] = {"first": FIRST_SLOT, "predictor": ["predictor=true", "key_bn=batch"],
                               "split": ["predictor=true", "key_bn=split"]}

# name -> (method, --set assignments on top of train/cpu_demo.yaml; each names its flip policy and motion ops, so
# a variant means the same whatever the recipe adopts). "base" is the SimCLR base of the ladder; "paper" MoQuad
# with the paper's augmentation (speed Intra-Negs, flips per view).
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "random": ("untrained", []),
    "random+diff": ("untrained", ["model_input=diff"]),
    "base": ("simclr", ["loader.flip=independent"]),
    "paper": ("moquad", ["loader.motion_ops=speed", "loader.flip=independent"]),
    "reverse": ("moquad", ["loader.motion_ops=reverse", "loader.flip=independent"]),
    "shared_flip": ("moquad", ["loader.motion_ops=speed", "loader.flip=shared"]),
    "speed+reverse": ("moquad", ["loader.motion_ops=speed,reverse", "loader.flip=independent"]),
    "periodic": ("moquad", ["loader.motion_ops=periodic", "loader.flip=shared"]),
    "speed+reverse+shared": ("moquad", ["loader.motion_ops=speed,reverse", "loader.flip=shared"]),
    "reverse+shared": ("moquad", ["loader.motion_ops=reverse", "loader.flip=shared"]),
    "base+shared": ("simclr", ["loader.flip=shared"]),
    "speed+reverse+shared+diff": ("moquad", ["loader.motion_ops=speed,reverse", "loader.flip=shared",
                                             "model_input=diff"]),
    "base+shared+diff": ("simclr", ["loader.flip=shared", "model_input=diff"]),
    # the momentum base (moquad.train.momentum; docs/guides/methods.md): MoCo, its Table 4 rungs, MoQuad on it; queue 128
    # keys (about half a demo train split), m0 0.99; "@b8": the same at global batch 8, where a queue should matter
    "moco": ("moco", ["loader.flip=independent", *FIRST_SLOT, "queue_size=128"]),
    "moco+ad_pos": ("moco_moquad", ["loader.motion_ops=speed", "loader.flip=independent", *FIRST_SLOT, "queue_size=128",
                                    "loader.intra_neg=false", "loader.ad_intra_neg=false"]),
    "moco+ad_pos+intra_neg": ("moco_moquad", ["loader.motion_ops=speed", "loader.flip=independent",
                                              *FIRST_SLOT, "queue_size=128", "loader.ad_intra_neg=false"]),
    "moco_moquad": ("moco_moquad", ["loader.motion_ops=speed", "loader.flip=independent", *FIRST_SLOT, "queue_size=128"]),
    # MoQuad on the momentum base with the demo recipe's adopted options (Intra-Negs by speed and time reversal, one
    # flip per quadruple), against "moco" as the README's "adopted" row is against "base"
    "moco_adopted": ("moco_moquad", ["loader.motion_ops=speed,reverse", "loader.flip=shared", *FIRST_SLOT, "queue_size=128"]),
    # the momentum base's sweep (`types`, seed 0; docs/guides/methods.md): "moco" with ONE factor changed, each named as the
    # setting it changes (the key encoder's BatchNorm, the symmetric loss, tau, m0, the predictor, the optimizer and
    # its lr, the queue size)
    # then combinations of them ("moco+predictor+key_bn=groups": both)
    **{f"moco+{'+'.join(names)}": ("moco", ["loader.flip=independent", *FIRST_SLOT, "queue_size=128",
                                            *(x for n in names for x in SWEEP[n])]) for names in SWEPT},
    # each method exactly as `moquad pretrain --recipe train/cpu_demo.yaml --method M` trains it (its row's and the
    # recipe's settings, nothing set here): the evidence of docs/guides/methods.md
    **{f"demo-{m}": (m, []) for m in ("simclr", "moquad", "moco", "moco_moquad")},
    **{f"demo-{m}@b8": (m, ["batch_size=8"]) for m in ("simclr", "moquad", "moco", "moco_moquad")},
    # the demo's momentum methods with ONE sweep factor changed on top of their rows' defaults, on the families the
    # sweep did not see ("demo-moco+m0=0.9")
    **{f"demo-{m}+{n}": (m, SWEEP[n]) for m in ("moco", "moco_moquad") for n in ("m0=0.9", "tau=0.2", "lars_lr=64")},
    # the momentum slot's settings on every family ("demo-moco_moquad+slot=split")
    **{f"demo-{m}+slot={n}": (m, sets) for m in ("moco", "moco_moquad") for n, sets in SLOTS.items()},
    "base@b8": ("simclr", ["loader.flip=independent", "batch_size=8"]),
    "paper@b8": ("moquad", ["loader.motion_ops=speed", "loader.flip=independent", "batch_size=8"]),
    "moco@b8": ("moco", ["loader.flip=independent", *FIRST_SLOT, "queue_size=128", "batch_size=8"]),
    "moco_moquad@b8": ("moco_moquad", ["loader.motion_ops=speed", "loader.flip=independent", *FIRST_SLOT,
                                       "queue_size=128",
                                       "batch_size=8"]),
}


# family -> (``moquad synth --kind``, its other arguments). "directions-still" / "-slow": the same videos as
# "directions" for a seed, with a still camera (``--camera-drift 0``) or one a third as fast (0.5 px per frame at
# 64 px; the default 1.5 is the objects' speed): what the class-free camera drift costs each method.
FAMILIES: dict[str, tuple[str, dict]] = {
    "types": ("types", {}),
    "directions": ("directions", {}),
    "camera": ("camera", {}),
    "directions-still": ("directions", {"camera_drift": 0.0}),
    "directions-slow": ("directions", {"camera_drift": 0.5}),
}


def data_dir(out: Path, family: str, seed: int) -> Path:
    """A ladder's folder of one family and seed's videos (``raw/``) and shards (``shards/``)."""
    return out / "data" / family / f"seed{seed}"


def run_dir(out: Path, family: str, seed: int, variant: str) -> Path:
    """A ladder's run folder of one variant on one family and seed (``checkpoints/last.pt`` where it trains)."""
    return out / "runs" / family / f"seed{seed}" / variant


def family_data(out: Path, family: str, seed: int, source: str | None) -> Path:
    """Shards of one family and seed (made once)."""
    from moquad.preprocess.run import preprocess
    from moquad.quickstart import SYNTH
    from moquad.synth import make_synth

    raw, shards = data_dir(out, family, seed) / "raw", data_dir(out, family, seed) / "shards"
    if not (raw / "ucfTrainTestlist" / "testlist01.txt").is_file():
        kind, extra = FAMILIES[family]
        extra = {**extra, "source": source} if kind == "camera" else extra
        make_synth(raw, classes=4, per_class=100, seed=seed, kind=kind, **SYNTH, **extra)
    if not (shards / "dataset.json").is_file():
        preprocess(C.update(C.PreprocessConfig(), dict(dataset="ucf101", root=str(raw), out=str(shards),
                                                       short_side=SYNTH["size"], workers=2, seed=seed)))
    return shards


def run_variant(shards: Path, run: Path, variant: str, seed: int, epochs: int | None) -> dict:
    """Pre-train one variant (or none for ``random``) and measure it; returns the metrics and the run's ranks."""
    from moquad.quickstart import _save_untrained, demo_pretrain_config, evaluate
    from moquad.train.loop import pretrain

    method, sets = VARIANTS[variant]
    cfg = demo_pretrain_config(shards, run, "simclr" if method == "untrained" else method, epochs, seed)
    cfg = C.update(cfg, C.parse_sets(cfg, sets))
    if method == "untrained":
        ckpt = run / "checkpoints" / "last.pt"
        _save_untrained(cfg, ckpt)
    else:
        ckpt = pretrain(dataclasses.replace(cfg, resume=(run / "checkpoints" / "last.pt").is_file()))
    from rich.console import Console

    res = evaluate(shards, ckpt, run / "eval", Console())
    res.update(_ranks(run))
    return res


def _ranks(run: Path) -> dict:
    """Fig. 4 ranks averaged over the last 20 % of logged MoQuad steps (empty for other runs)."""
    from moquad.train.log import read_log

    log = run / "log.jsonl"
    rows = [r for r in read_log(log) if r.get("mode") == "moquad"] if log.is_file() else []
    rows = rows[int(0.8 * len(rows)):]
    out = {}
    for key in ("rank_ad_pos", "rank_intra_neg"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if vals:
            out[key] = statistics.mean(vals)
    return out


def supervised(shards: Path, run: Path, seed: int) -> dict:
    """The supervised bound: the demo's fine-tuning settings from random init (``moquad finetune --init random
    --backbone tiny --recipe eval/cpu_demo.yaml``), its test top-1 in every column."""
    from moquad.eval.finetune import finetune
    from moquad.quickstart import EVAL_RECIPE, demo_recipe

    cfg = settings.resolve(C.EvalConfig(), demo_recipe(EVAL_RECIPE), {
        "out": str(run), "data": str(shards), "seed": seed, "finetune.init": "random", "finetune.backbone": "tiny"})
    top1 = finetune(cfg)["top1"]
    return {"hit@1": top1, "knn_top1": top1, "linear_top1": top1}


def load_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def table(rows: list[dict]) -> str:
    """Markdown table: family, variant, seeds, mean +- std of the three measures and the Fig. 4 ranks."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["family"], r["variant"]), []).append(r)
    lines = ["| family | variant | seeds | hit@1 | weighted kNN | linear | rank AD-Pos / Intra-Negs |",
             "|---|---|---:|---:|---:|---:|---:|"]
    order = list(dict.fromkeys(["random", "supervised", *VARIANTS]))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for (fam, var), rs in sorted(groups.items(), key=lambda kv: (families.index(kv[0][0]), order.index(kv[0][1]))):
        cells = []
        for m in ("hit@1", "knn_top1", "linear_top1"):
            v = [100 * r[m] for r in rs]
            cells.append(f"{statistics.mean(v):.1f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.1f}")
        ranks = [(r["rank_ad_pos"], r["rank_intra_neg"]) for r in rs if "rank_ad_pos" in r and "rank_intra_neg" in r]
        rank = (f"{statistics.mean(a for a, _ in ranks):.2f} / {statistics.mean(b for _, b in ranks):.1f}"
                if ranks else "–")
        lines.append(f"| {fam} | {var} | {','.join(str(r['seed']) for r in rs)} | " + " | ".join(cells) + f" | {rank} |")
    return "\n".join(lines)


def _by_run(rows: list[dict]) -> dict[tuple[str, str, int], dict]:
    return {(r["family"], r["variant"], r["seed"]): r for r in rows}


def _paired_seeds(by: dict, family: str, base: str, variant: str) -> list[int]:
    """The seeds of ``family`` on which both ``base`` and ``variant`` finished."""
    return sorted(s for (f, v, s) in by if f == family and v == variant and (f, base, s) in by)


def _diffs(by: dict, family: str, base: str, variant: str, measure: str, seeds: list[int]) -> list[float]:
    """Per-seed ``variant`` minus ``base`` of one measure, in points."""
    return [100 * (by[family, variant, s][measure] - by[family, base, s][measure]) for s in seeds]


def goal(rows: list[dict], adopted: str = "speed+reverse+shared") -> str:
    """The goal per family: ``adopted`` minus the base and minus random init, weighted kNN and linear top-1,
    means over the seeds all three share (goal: >= 15 points over the base on both, above random)."""
    by = _by_run(rows)
    lines = ["| family | seeds | kNN: adopted − base | linear: adopted − base | kNN / linear: adopted − random | "
             "goal met |", "|---|---:|---:|---:|---:|---|"]
    for fam in dict.fromkeys(r["family"] for r in rows):
        seeds = sorted(set(_paired_seeds(by, fam, "base", adopted)) & set(_paired_seeds(by, fam, "random", adopted)))
        if not seeds:
            continue
        gain = {(other, m): statistics.mean(_diffs(by, fam, other, adopted, m, seeds))
                for other in ("base", "random") for m in ("knn_top1", "linear_top1")}
        met = gain["base", "knn_top1"] >= 15 and gain["base", "linear_top1"] >= 15 and \
            gain["random", "knn_top1"] > 0 and gain["random", "linear_top1"] > 0
        lines.append(f"| {fam} | {','.join(map(str, seeds))} | {gain['base', 'knn_top1']:+.1f} | "
                     f"{gain['base', 'linear_top1']:+.1f} | {gain['random', 'knn_top1']:+.1f} / "
                     f"{gain['random', 'linear_top1']:+.1f} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def compare(rows: list[dict], pairs: list[str]) -> str:
    """Paired gains: for each ``BASE:VARIANT`` and family, VARIANT minus BASE on the seeds both finished, mean +- std
    of the per-seed differences (points), the three measures."""
    by = _by_run(rows)
    lines = ["| family | variant − base | seeds | hit@1 | weighted kNN | linear |", "|---|---|---:|---:|---:|---:|"]
    for pair in pairs:
        base, var = pair.split(":")
        for fam in dict.fromkeys(r["family"] for r in rows):
            seeds = _paired_seeds(by, fam, base, var)
            if not seeds:
                continue
            cells = []
            for m in ("hit@1", "knn_top1", "linear_top1"):
                d = _diffs(by, fam, base, var, m, seeds)
                cells.append(f"{statistics.mean(d):+.1f} ± {statistics.stdev(d):.1f}" if len(d) > 1 else f"{d[0]:+.1f}")
            lines.append(f"| {fam} | {var} − {base} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _class_accuracy(run: Path) -> dict[str, float]:
    """A run's top-1 per class (%): weighted kNN on its cached features (retrieve's protocol), or a supervised
    run's test accuracy per class; empty when the run has neither."""
    from moquad.config import EvalConfig
    from moquad.eval.features import read_features
    from moquad.eval.retrieve import knn_classify
    from moquad.eval.search import nearest, prepare

    feats, sup = run / "eval" / "features", run / "finetune_random.json"
    if (feats / "test.lance").exists() and (feats / "train.lance").exists():
        qf, gf = read_features(feats / "test.lance"), read_features(feats / "train.lance")
        q, g, k = prepare(qf["embedding"], False), prepare(gf["embedding"], False), EvalConfig().knn_k
        per = knn_classify(q, g, nearest(q, g, k), qf["label"], gf["label"], k, EvalConfig().knn_t)["per_class_top1"]
        names = dict(zip(qf["label"].tolist(), qf["class_name"]))
        return {names[c]: 100 * v for c, v in per.items()}
    if sup.is_file():
        return {r["class"]: 100 * r["accuracy"] for r in json.loads(sup.read_text())["per_class"]}
    return {}


def per_class(out: Path, family: str) -> str:
    """Markdown: per class of ``family``, each variant's top-1 (weighted kNN; supervised: fine-tuned), mean over
    the seeds whose runs are under OUT: which classes a method's features tell apart."""
    acc: dict[str, dict[str, list[float]]] = {}
    for run in sorted((out / "runs" / family).glob("seed*/*")):
        for name, v in _class_accuracy(run).items():
            acc.setdefault(run.name, {}).setdefault(name, []).append(v)
    classes = list(dict.fromkeys(c for per in acc.values() for c in per))
    lines = [f"| {family}: variant | seeds | " + " | ".join(classes) + " |", "|---|---:|" + "---:|" * len(classes)]
    for var in [v for v in dict.fromkeys(["random", "supervised", *VARIANTS]) if v in acc]:
        cells = [f"{statistics.mean(acc[var][c]):.1f}" if c in acc[var] else "–" for c in classes]
        lines.append(f"| {var} | {max(len(v) for v in acc[var].values())} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Grouped bars: per family, each variant's mean weighted-kNN and linear top-1 (error bars: std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r["family"] for r in rows})
    variants = [v for v in dict.fromkeys(["random", "supervised", *VARIANTS]) if any(r["variant"] == v for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    colours = plt.get_cmap("tab20").colors
    for ax, metric, title in zip(axes, ("knn_top1", "linear_top1"), ("weighted kNN top-1", "linear probe top-1")):
        width = 0.8 / len(variants)
        for j, var in enumerate(variants):
            means, stds = [], []
            for fam in families:
                v = [100 * r[metric] for r in rows if (r["family"], r["variant"]) == (fam, var)]
                means.append(statistics.mean(v) if v else float("nan"))  # not run: no bar
                stds.append(statistics.stdev(v) if len(v) > 1 else 0.0)
            ax.bar([i + j * width for i in range(len(families))], means, width, yerr=stds, label=var, capsize=2,
                   color=colours[j % len(colours)])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(families))], families)
        ax.axhline(25, color="grey", lw=0.8, ls="--")
        ax.set_title(title + " (%; dashed: chance)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=min(7, len(variants)), fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/ladder")
    ap.add_argument("--families", nargs="+", default=["types", "directions"], choices=list(FAMILIES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variants", nargs="+", default=["random", "base", "paper"],
                    help=f"supervised, {', '.join(VARIANTS)}")
    ap.add_argument("--source", default=None, help="folder of real videos for the camera family")
    ap.add_argument("--epochs", type=int, default=None, help="default: the demo recipe's")
    ap.add_argument("--stop", default=None, metavar="FILE", help="stop before the next run once FILE exists")
    ap.add_argument("--table", action="store_true", help="only print the table of finished runs")
    ap.add_argument("--plot", default=None, help="also draw the finished runs' bars to this PNG")
    ap.add_argument("--per-class", default=None, metavar="FAMILY", help="only print FAMILY's top-1 per class")
    ap.add_argument("--compare", nargs="+", default=None, metavar="BASE:VARIANT",
                    help="only print each VARIANT's paired gain over BASE per family (e.g. moco:moco_moquad)")
    args = ap.parse_args()
    if args.per_class:
        print(per_class(Path(args.out), args.per_class))
        return
    if args.compare:
        print(compare(load_results(Path(args.out) / "results.jsonl"), args.compare))
        return
    out = Path(args.out)
    path = out / "results.jsonl"
    if not args.table:
        for family in args.families:
            for seed in args.seeds:
                shards = family_data(out, family, seed, args.source)
                for variant in args.variants:
                    done = {(r["family"], r["seed"], r["variant"]) for r in load_results(path)}
                    if (family, seed, variant) in done:
                        continue
                    if args.stop and Path(args.stop).exists():
                        print(f"{args.stop} exists: stopped before {family} seed {seed} {variant}", flush=True)
                        return
                    t0 = time.time()
                    run = run_dir(out, family, seed, variant)
                    res = supervised(shards, run, seed) if variant == "supervised" else \
                        run_variant(shards, run, variant, seed, args.epochs)
                    row = {"family": family, "seed": seed, "variant": variant, **res, "seconds": time.time() - t0,
                           **provenance()}
                    with path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    print(table(load_results(path)))
    print()
    print(goal(load_results(path)))
    if args.plot:
        plot(load_results(path), Path(args.plot))


if __name__ == "__main__":
    main()
