"""`moquad quickstart`: every stage end to end on generated data, SimCLR vs MoQuad.

synth (classes differ only by motion) -> preprocess -> verify -> pretrain SimCLR and
MoQuad with the same budget -> retrieval for both and for the untrained network ->
a table on the terminal, ``comparison.json`` and ``comparison.png``. The settings are
sized for a 2-core CPU (tiny backbone, 48 px videos, 32 px clips); the same commands scale to real
data by changing the dataset, backbone and recipe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from moquad import config as C

KS = (1, 5, 10, 20)


# Synthetic data and input size of the demo: 48 px videos with three moving objects, 32 px clips.
SYNTH = dict(size=48, frames=48, objects=3)
CLIP_SIZE = 32


def demo_pretrain_config(data: Path, out: Path, method: str, epochs: int, seed: int,
                         backbone: str = "tiny") -> C.PretrainConfig:
    """The CPU-sized pre-training settings shared by both methods (only ``method`` differs).

    Two defaults differ from the paper's recipe, both found with the Fig. 4 diagnostic (rank of the
    Intra-Negs among the anchor's candidates; README "Evidence"):

    - no appearance warm-up (``warmup_ratio=0``): the warm-up task pulls clips of the same video
      at DIFFERENT speeds together, i.e. it teaches speed invariance; after 20% of a short run the
      tiny network never separated the Intra-Negs again (rank 3.1 vs AD-Pos 2.0 of 63 after 600
      steps), without it they are separated within 200 steps (rank 7.6 vs 1.5);
    - dilations 1 and 4 only: RAD scales every temporal gradient by ``1 - lambda`` in [0.5, 0.9], so
      an AD-Pos at speed n moves as "fast" as an Intra-Neg at n / 2; 4x apart, speed stays
      distinguishable by a network too small to measure true displacement.
    """
    return C.update(
        C.PretrainConfig(),
        dict(
            data=str(data), out=str(out), method=method, backbone=backbone, epochs=epochs, batch_size=16,
            lr=16.0, optimizer="lars", lr_warmup_epochs=max(1, epochs // 20), temperature=0.1,
            warmup_ratio=0.0, hard_beta=0.01, hard_alpha=1.5, proj_hidden=256, proj_dim=64,
            ckpt_every=10_000, seed=seed, device="auto",
            # colour jitter and grayscale off, milder crops: with them on, the tiny network's loss
            # does not fall within this budget for either method (measured)
            loader=dict(frames=8, size=CLIP_SIZE, dilations=(1, 4), simclr_dilation=2, workers=1,
                        color_jitter=0.0, grayscale=0.0, crop_scale=(0.6, 1.0),
                        seed=seed),
        ),
    )


def demo_eval_config(data: Path, checkpoint: Path, out: Path) -> C.EvalConfig:
    return C.update(
        C.EvalConfig(),
        dict(data=str(data), checkpoint=str(checkpoint), out=str(out), num_clips=5, frames=8, dilation=2,
             size=CLIP_SIZE, batch_size=32, ks=KS, device="auto", workers=0),
    )


def _plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(names):
        vals = [100 * results[name][f"top{k}"] for k in KS]
        bars = ax.bar([j + i * width for j in range(len(KS))], vals, width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    chance = results[names[0]].get("chance_top1")
    if chance:
        ax.axhline(100 * chance, color="grey", ls="--", lw=1, label="chance (top-1)")
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(KS))], [f"top-{k}" for k in KS])
    ax.set_ylabel("retrieval accuracy (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Synthetic motion data: test queries vs train gallery")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def quickstart(out: str | Path, epochs: int = 60, classes: int = 4, per_class: int = 100, seed: int = 0,
               backbone: str = "tiny") -> dict:
    """Run every stage; return ``{method: retrieval result}``."""
    from moquad.preprocess.manifest import verify
    from moquad.preprocess.run import preprocess
    from moquad.synth import make_synth
    from moquad.train.loop import pretrain
    from moquad.train.plot import plot_run

    console = Console()
    out = Path(out)
    t0 = time.time()
    raw, shards = out / "data" / "synth", out / "data" / "shards"

    console.rule("[bold]1/4 synth: videos whose classes differ only by motion")
    settings = dict(classes=classes, per_class=per_class, seed=seed, backbone=backbone, epochs=epochs, **SYNTH)
    stamp = out / "quickstart.json"  # a rerun reuses data and finished runs only if made with these settings
    if stamp.is_file() and json.loads(stamp.read_text()) != settings:
        raise ValueError(f"{out} holds a quickstart made with other settings ({stamp}); choose a new --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(settings, indent=2))
    if not (raw / "ucfTrainTestlist" / "testlist01.txt").is_file():
        make_synth(raw, classes=classes, per_class=per_class, seed=seed, **SYNTH)
    console.print(f"{classes * per_class} videos in {raw}")

    console.rule("[bold]2/4 preprocess: shards + manifests")
    if not (shards / "dataset.json").is_file():
        preprocess(C.update(C.PreprocessConfig(), dict(dataset="ucf101", root=str(raw), out=str(shards),
                                                       short_side=SYNTH["size"], workers=2, seed=seed)))
    problems = verify(shards)
    if problems:
        raise RuntimeError(f"verify found {len(problems)} problems, first: {problems[0]}")
    console.print(f"verify: {shards} OK")

    console.rule("[bold]3/4 pretrain: SimCLR and MoQuad, same budget")
    checkpoints = {}
    for method in ("simclr", "moquad"):
        cfg = demo_pretrain_config(shards, out / method, method, epochs, seed, backbone)
        last = Path(cfg.out) / "checkpoints" / "last.pt"
        checkpoints[method] = last if last.is_file() and _finished(last, epochs) else pretrain(cfg)
        console.print(f"{method}: curves (loss, lr, Fig. 4 ranks) in {plot_run(cfg.out)}")
    random_ckpt = out / "random" / "checkpoints" / "last.pt"
    if not random_ckpt.is_file():
        _save_untrained(demo_pretrain_config(shards, out / "random", "simclr", 0, seed, backbone), random_ckpt)
    checkpoints = {"random init": random_ckpt, **checkpoints}

    console.rule("[bold]4/4 retrieve: test split queries the train split")
    from moquad.eval.retrieve import (
        retrieve,  # imports lance: after every forking stage (it is not fork-safe)
    )

    results = {}
    for name, ckpt in checkpoints.items():
        results[name] = retrieve(demo_eval_config(shards, ckpt, out / "eval" / name.replace(" ", "_")))

    table = Table(title=f"Retrieval on synthetic motion data ({classes} classes, {epochs} epochs, {backbone} backbone)")
    table.add_column("method")
    for k in KS:
        table.add_column(f"top-{k}", justify="right")
    for name, r in results.items():
        table.add_row(name, *[f"{100 * r[f'top{k}']:.1f}" for k in KS])
    console.print(table)
    summary = {name: {f"top{k}": r[f"top{k}"] for k in KS} for name, r in results.items()}
    (out / "comparison.json").write_text(json.dumps(summary, indent=2))
    for r in results.values():
        r.setdefault("chance_top1", 1.0 / classes)
    _plot(results, out / "comparison.png")
    console.print(f"wrote {out / 'comparison.json'} and {out / 'comparison.png'} in {time.time() - t0:.0f} s")
    console.print("Read the Fig. 4 curves (moquad/curves.png): MoQuad learns motion once its Intra-Negs (the same "
                  "video at another speed) rank far below its AD-Pos; see README, 'Synthetic evidence'.")
    return results


def _save_untrained(cfg: C.PretrainConfig, path: Path) -> None:
    """A checkpoint of the randomly initialised network: the floor every method must beat."""
    import torch

    from moquad import __version__
    from moquad.models import build_model
    from moquad.train import checkpoint

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.backbone, proj_dim=cfg.proj_dim, proj_hidden=cfg.proj_hidden)
    checkpoint.save({"model": model.state_dict(), "step": 0, "epoch": -1, "config": C.to_dict(cfg),
                     "seeds": {"seed": cfg.seed}, "moquad_version": __version__, "git": checkpoint.git_revision()},
                    path)


def _finished(ckpt: Path, epochs: int) -> bool:
    from moquad.train import checkpoint

    return int(checkpoint.load(ckpt).get("epoch", -1)) + 1 >= epochs
