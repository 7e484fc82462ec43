"""`moquad quickstart`: every stage end to end on generated data, SimCLR vs MoQuad.

synth (classes differ only by motion) -> preprocess -> verify -> pretrain SimCLR and
MoQuad with the same budget -> retrieval for both and for the untrained network ->
a table on the terminal, ``comparison.json`` and ``comparison.png`` -> the motion report of the three
networks on the test split (``moquad motion``: ``motion/motion.json``, ``motion/motion.png``). The settings are
sized for a 2-core CPU (tiny backbone, 48 px videos, 32 px clips) and are two recipes,
``train/cpu_demo.yaml`` and ``eval/cpu_demo.yaml`` (why they differ from the paper's: see the
first), so ``moquad pretrain`` / ``moquad retrieve`` with them reproduce each stage; the same
commands scale to real data by changing the dataset, backbone and recipe.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from moquad import config as C
from moquad import settings
from moquad.errors import MoquadError
from moquad.io import atomic_write_text
from moquad.recipes import RECIPE_ROOT, find_recipe
from moquad.train.methods import DEMO

KS = (1, 5, 10, 20)  # the ks of eval/cpu_demo.yaml (tests/test_quickstart.py keeps them equal)
TRAIN_RECIPE, EVAL_RECIPE = "train/cpu_demo.yaml", "eval/cpu_demo.yaml"

# Synthetic data of the demo: 48 px videos with three moving objects (the recipes crop 32 px clips).
SYNTH = dict(size=48, frames=48, objects=3)


def demo_recipe(name: str) -> Path:
    """A packaged recipe (``moquad recipes`` lists them)."""
    path = find_recipe(name)
    if not path.is_file():
        raise MoquadError(f"recipe {name} not found in {RECIPE_ROOT}; reinstall moquad (pip install moquad)")
    return path


def demo_pretrain_config(data: Path, out: Path, method: str, epochs: int | None = None, seed: int = 0,
                         backbone: str | None = None) -> C.PretrainConfig:
    """What ``moquad pretrain --data DATA --recipe train/cpu_demo.yaml --method M --out OUT`` resolves to,
    plus ``--seed S`` and, when given, ``--backbone B`` and ``--epochs N --lr-warmup-epochs max(1, N // 20)``."""
    flags: dict = dict(data=str(data), out=str(out), method=method, seed=seed, backbone=backbone)
    flags["loader.seed"] = seed  # as --seed does
    if epochs is not None:
        flags.update(epochs=epochs, lr_warmup_epochs=max(1, epochs // 20))
    return settings.resolve(C.PretrainConfig(), demo_recipe(TRAIN_RECIPE), flags)


def demo_eval_config(data: Path, checkpoint: Path, out: Path) -> C.EvalConfig:
    """What ``moquad retrieve --data DATA --checkpoint CKPT --recipe eval/cpu_demo.yaml --out OUT`` resolves to."""
    return settings.resolve(C.EvalConfig(), demo_recipe(EVAL_RECIPE), dict(data=str(data), checkpoint=str(checkpoint),
                                                                    out=str(out), recipe=EVAL_RECIPE))


def _plot(results: dict[str, dict], chance: float, path: Path) -> None:
    """Grouped bars: the three measures (x) for each method (colour), chance as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(names):
        vals = [100 * results[name][m] for m in METRICS]
        bars = ax.bar([j + i * width for j in range(len(METRICS))], vals, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.axhline(100 * chance, color="grey", ls="--", lw=1, label="chance")
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(METRICS))], list(METRICS.values()))
    ax.set_ylabel("accuracy on the test split (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Synthetic motion data: frozen features of each method")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def quickstart(out: str | Path, epochs: int | None = None, classes: int = 4, per_class: int = 100, seed: int = 0,
               backbone: str | None = None, kind: str = "types", source: str | Path | None = None) -> dict:
    """Run every stage; return ``{method: {metric: value}}`` (:data:`METRICS`). ``epochs`` / ``backbone``: None =
    the recipe's; ``kind``: the synthetic family (``moquad synth --kind``; ``camera`` cuts it from ``source``)."""
    from moquad.preprocess.manifest import verify
    from moquad.preprocess.run import preprocess
    from moquad.synth import make_synth

    console = Console()
    out = Path(out)
    t0 = time.time()
    raw, shards = out / "data" / "synth", out / "data" / "shards"

    console.rule("[bold]1/5 synth: videos whose classes differ only by motion")
    base = demo_pretrain_config(shards, out, DEMO[-1], epochs, seed, backbone)
    epochs, backbone = base.epochs, base.backbone
    default = demo_pretrain_config(shards, out, DEMO[-1], None, seed, None)
    base_epochs, base_backbone = default.epochs, default.backbone
    made_with = dict(classes=classes, per_class=per_class, seed=seed, backbone=backbone, epochs=epochs, kind=kind,
                     **SYNTH)
    if source is not None:
        made_with["source"] = str(Path(source).resolve())
    stamp = out / "quickstart.json"  # a rerun reuses data and finished runs only if made with these settings
    if stamp.is_file() and json.loads(stamp.read_text()) != made_with:
        raise ValueError(f"{out} holds a quickstart made with other settings ({stamp}); choose a new --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, json.dumps(made_with, indent=2))
    if not (raw / "ucfTrainTestlist" / "testlist01.txt").is_file():
        make_synth(raw, classes=classes, per_class=per_class, seed=seed, kind=kind, source=source, **SYNTH)
    console.print(f"{classes * per_class} videos in {raw}")

    console.rule("[bold]2/5 preprocess: shards + manifests")
    if not (shards / "dataset.json").is_file():
        preprocess(C.update(C.PreprocessConfig(), dict(dataset="ucf101", root=str(raw), out=str(shards),
                                                       short_side=SYNTH["size"], workers=2, seed=seed)))
    problems = verify(shards)
    if problems:
        raise RuntimeError(f"verify found {len(problems)} problems, first: {problems[0]}")
    console.print(f"verify: {shards} OK")

    console.rule("[bold]3/5 pretrain: SimCLR and MoQuad, same budget")
    checkpoints = _pretrain_all(console, shards, out, epochs, seed, backbone)

    console.rule("[bold]4/5 evaluate: retrieval, weighted kNN and a linear probe on the same features")
    results = {name: evaluate(shards, ckpt, out / "eval" / name.replace(" ", "_"), console)
               for name, ckpt in checkpoints.items()}
    _report(console, results, out, f"{kind} family, {classes} classes, {epochs} epochs, {backbone} backbone",
            1.0 / classes)
    if (classes, per_class, epochs, backbone) == (4, 100, base_epochs, base_backbone):  # the recorded settings
        against_record(console, results, kind)
    console.rule("[bold]5/5 motion report: arrow of time, speed, mirror, appearance share of the same networks")
    _motion(console, shards, checkpoints, out / "motion")
    console.print(f"done in {time.time() - t0:.0f} s. Read the Fig. 4 curves (moquad/curves.png): MoQuad learns motion "
                  "once its Intra-Negs (the same video at another speed) rank far below its AD-Pos; the docs' Evidence "
                  "page (docs/results/evidence.md) says what the demo shows.")
    return results


METRICS = {"hit@1": "retrieval hit@1", "knn_top1": "weighted kNN top-1", "linear_top1": "linear probe top-1"}


def evaluate(shards: Path, ckpt: Path, out: Path, console: Console) -> dict[str, float]:
    """The demo's three measures of a checkpoint, on one set of cached features (eval/cpu_demo.yaml):
    retrieval hit@k (test queries vs the train gallery), DINO's weighted kNN and the fast linear probe."""
    console.print(f"moquad retrieve --data {shards} --checkpoint {ckpt} --recipe {EVAL_RECIPE} --out {out}  (and "
                  "moquad linear --fast with the same flags)")
    from moquad.eval.linear import linear  # imports lance: after every forking stage (it is not fork-safe)
    from moquad.eval.retrieve import retrieve

    cfg = demo_eval_config(shards, ckpt, out)
    r = retrieve(cfg, overwrite=True)  # the demo's own folder: a re-run replaces its results
    lin = linear(cfg, fast=True, overwrite=True)
    return {**{f"hit@{k}": r[f"top{k}"] for k in KS}, "knn_top1": r["knn_top1"], "linear_top1": lin["top1"]}


def _fit_batch(cfg: C.PretrainConfig, console: Console) -> C.PretrainConfig:
    """A token-sized demo (``--per-class`` small) may hold fewer training videos than the recipe's batch: an
    exact epoch cannot repeat a video, so the batch becomes the split's size (said on the terminal)."""
    from moquad.data.store import read_info

    videos = int(read_info(cfg.data)["splits"].get(cfg.split, 0))
    if 0 < videos < cfg.batch_size:
        console.print(f"[yellow]note:[/] {videos} training videos: batch {cfg.batch_size} -> {videos}")
        return dataclasses.replace(cfg, batch_size=videos)
    return cfg


def _pretrain_all(console: Console, shards: Path, out: Path, epochs: int, seed: int, backbone: str) -> dict[str, Path]:
    """SimCLR and MoQuad runs (reused when finished, resumed when cut short) and the untrained floor."""
    from moquad.train.loop import pretrain
    from moquad.train.plot import plot_run

    console.print(f"each run is: moquad pretrain --data {shards} --recipe {TRAIN_RECIPE} --method METHOD --out "
                  f"{out}/METHOD --seed {seed} --backbone {backbone} --epochs {epochs} --lr-warmup-epochs "
                  f"{max(1, epochs // 20)}")
    checkpoints = {}
    for method in DEMO:
        cfg = _fit_batch(demo_pretrain_config(shards, out / method, method, epochs, seed, backbone), console)
        last = Path(cfg.out) / "checkpoints" / "last.pt"
        if last.is_file() and _finished(last, cfg.epochs):
            checkpoints[method] = last
        else:  # a run cut short (Ctrl-C, a full disk) continues where it stopped
            checkpoints[method] = pretrain(dataclasses.replace(cfg, resume=last.is_file()))
        console.print(f"{method}: curves (loss, lr, Fig. 4 ranks) in {plot_run(cfg.out)}")
    random_ckpt = out / "random" / "checkpoints" / "last.pt"
    if not random_ckpt.is_file():
        _save_untrained(demo_pretrain_config(shards, out / "random", DEMO[0], epochs, seed, backbone), random_ckpt)
    return {"random init": random_ckpt, **checkpoints}


def _motion(console: Console, shards: Path, checkpoints: dict[str, Path], out: Path) -> None:
    """``moquad motion --data SHARDS random_init=... simclr=... moquad=... --out OUT`` on the test split."""
    from moquad.eval.motion import load_encoder, motion_report, write_report

    console.print(f"moquad motion --data {shards} " + " ".join(f"{n.replace(' ', '_')}={c}" for n, c in
                                                                checkpoints.items()) + f" --out {out}")
    encoders = [load_encoder(f"{name}={ckpt}") for name, ckpt in checkpoints.items()]
    json_path, png = write_report(motion_report(shards, encoders, split="test"), out)
    console.print(f"wrote {json_path} and {png}: a motion-sensitive encoder tells a clip from its reversal (arrow of "
                  "time well above 50 %) and keeps a low appearance share")


def _report(console: Console, results: dict[str, dict], out: Path, what: str, chance: float) -> None:
    """The terminal table, comparison.json and comparison.png."""
    table = Table(title=f"Synthetic motion data ({what}); chance {100 * chance:.0f}%")
    table.add_column("method")
    for label in METRICS.values():
        table.add_column(f"{label} (%)", justify="right")
    table.add_column("hit@5 (%)", justify="right")
    for name, r in results.items():
        table.add_row(name, *[f"{100 * r[m]:.1f}" for m in METRICS], f"{100 * r['hit@5']:.1f}")
    console.print(table)
    atomic_write_text(out / "comparison.json", json.dumps({"chance_top1": chance, **results}, indent=2))
    _plot(results, chance, out / "comparison.png")
    console.print(f"wrote {out / 'comparison.json'} and {out / 'comparison.png'}")


def against_record(console: Console, results: dict[str, dict], kind: str) -> dict | None:
    """This run beside what the demo gives over three seeds (``docs/results/synth_evidence.json`` of a checkout,
    made by ``experiments/synth_evidence.py``): each figure with the seeds' mean ± sample std and whether it lies
    within two std of the mean. None (and nothing printed) where the checkout has no such record."""
    import statistics

    from moquad.record import RESULTS

    try:
        rec = json.loads((RESULTS / "synth_evidence.json").read_text())
        seeds = rec["figures"]["results"][kind]
    except (OSError, KeyError, ValueError):
        return None
    machine = rec.get("machine", {})
    table = Table(title=f"This run against {len(rec['figures']['seeds'])} seeds of the same demo (mean ± std; "
                        f"{machine.get('cores', '?')}-core {machine.get('cpu', 'CPU')}, {rec.get('date', '')[:10]})")
    table.add_column("method")
    for label in METRICS.values():
        table.add_column(f"{label} (%)", justify="right")
    verdict = {}
    for name, r in results.items():
        cells = []
        for m in METRICS:
            vals = [100 * x for x in seeds.get(name, {}).get(m, [])]
            if len(vals) < 2:
                cells.append(f"{100 * r[m]:.1f}")
                continue
            mean, std = statistics.mean(vals), statistics.stdev(vals)
            inside = abs(100 * r[m] - mean) <= 2 * std + 0.05
            verdict[(name, m)] = inside
            cells.append(f"{100 * r[m]:.1f} [{mean:.1f} ± {std:.1f}]" + ("" if inside else " outside"))
        table.add_row(name, *cells)
    console.print(table)
    console.print("each cell: this run [the seeds' mean ± std]; 'outside': more than two std from the mean. Floats "
                  "differ between CPUs, so a run on other CPUs lands elsewhere within the spread, not on a seed's figure.")
    return verdict


def _save_untrained(cfg: C.PretrainConfig, path: Path) -> None:
    """A checkpoint of the randomly initialised network: the floor every method must beat."""
    import torch

    from moquad.models import build_model
    from moquad.train import checkpoint

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden, cfg.model_input)
    checkpoint.save(checkpoint.build(cfg, model, step=0, epoch=-1), path)


def _finished(ckpt: Path, epochs: int) -> bool:
    """A run's checkpoint says it trained all ``epochs`` (its ``epoch`` is the epoch the NEXT step belongs to)."""
    from moquad.train import checkpoint

    return int(checkpoint.load(ckpt).get("epoch", -1)) >= epochs
