"""The ``moquad`` command line: each command parses options, builds a config, calls ONE function.

Run ``moquad COMMAND --help`` for the options and an example of each command. On a
cluster the same commands run under torchrun: ``torchrun ... -m moquad.cli pretrain ...``.
Settings: defaults < ``--recipe`` < flags < ``--set KEY=VALUE``; errors: :mod:`moquad.cli_common`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from moquad import config as C
from moquad.cli_common import (
    _PRINT,
    _SET,
    _friendly,
    _need_dir,
    _printed,
    global_options,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="MoQuad: shard videos, pre-train motion-focused video encoders, evaluate them honestly.\n\n"
    "Stages: synth -> preprocess -> verify -> pretrain -> extract / retrieve / linear / finetune / cam. "
    "`moquad quickstart` runs them all on generated data.",
)


app.callback(epilog="Example: moquad --debug pretrain --data D  (or: MOQUAD_DEBUG=1 moquad ...)")(global_options)


# ----------------------------------------------------------------------------- stage 0: data


@app.command(epilog="Examples: moquad synth data/synth --classes 4 --per-class 8 --size 64 --frames 48 --objects 3  |  "
             "moquad synth data/dirs --kind directions --classes 4  (Up, Down, ZoomIn, ZoomOut: well posed with flips on)  |  "
             "moquad synth data/dirs8 --kind directions --classes 8  (adds Left/Right, Clockwise/CounterClockwise: "
             "pre-train with flips off, recipe `loader: {flip: false}`)")
@_friendly
def synth(
    out: str = typer.Argument(..., help="Folder to write the UCF101-layout dataset into."),
    kind: str = typer.Option("types", help="Family: 'types' (class = motion type: Translate, Rotate, Scale, "
                             "Oscillate, Orbit) or 'directions' (class = direction or sense of one motion: Up, Down, "
                             "ZoomIn, ZoomOut, Left, Right, Clockwise, CounterClockwise; 1/f textures, random camera "
                             "drift). A horizontal flip maps Left<->Right and Clockwise<->CounterClockwise, and moquad "
                             "flips views by default, so keep directions at --classes 4 unless you pre-train with "
                             "flips off."),
    classes: int = typer.Option(4, help="Number of classes, the first N of the family (types: 1-5, directions: 1-8)."),
    per_class: int = typer.Option(8, help="Videos per class."),
    size: int = typer.Option(64, help="Frame width and height in pixels."),
    frames: int = typer.Option(48, help="Frames per video (25 fps)."),
    objects: int = typer.Option(3, help="Moving objects per video (all with the class's motion)."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Generate a synthetic motion dataset (classes differ ONLY by motion) in UCF101's layout."""
    from moquad.synth import make_synth

    root = make_synth(out, classes=classes, per_class=per_class, size=size, frames=frames, seed=seed,
                      objects=objects, kind=kind)
    typer.echo(f"wrote {classes * per_class} videos to {root} (UCF101 layout; preprocess with `moquad preprocess ucf101 {root} --out DIR`)")


# ----------------------------------------------------------------------------- stage 1: preprocess


@app.command(
    epilog="Examples: moquad preprocess ucf101 /data/UCF101 --out /data/shards/ucf101 --split 1  |  "
    "moquad preprocess folder ~/my_videos --out data/mine --split-ratios 0.8,0.2  (class sub-folders)  |  "
    "moquad preprocess folder ~/my_videos/list.csv --out data/mine  (rows path,label[,split])  |  "
    "moquad preprocess k400 /data/k400 --out /data/shards/k400 --num-parts 8 --part 3  |  "
    "moquad preprocess k400 /data/k400 --out /data/shards/k400 --merge  |  "
    "moquad preprocess folder /data/clips --out /data/shards/clips --set jpeg_quality=95"
)
@_friendly
def preprocess(
    dataset: str = typer.Argument(..., help="One of: k400, ucf101, hmdb51, ssv2, folder."),
    root: str = typer.Argument(..., help="Dataset root (videos and annotation files)."),
    out: str = typer.Option(..., "--out", "-o", help="Output folder (or s3://, gs:// URL) for shards and manifests."),
    recipe: str | None = typer.Option(None, help="YAML recipe (preprocess/*.yaml); flags override it."),
    split: int | None = typer.Option(None, help="Official split number for ucf101/hmdb51 (1, 2 or 3)."),
    short_side: int | None = typer.Option(None, help="Resize so the short side is this many pixels (256; 128 for 112 crops)."),
    fps: float | None = typer.Option(None, help="Resample to this frame rate (default: native)."),
    jpeg_quality: int | None = typer.Option(None, help="JPEG quality 1-100 (90)."),
    shard_size: int | None = typer.Option(None, help="Source-video bytes per shard (1e9): shards are planned before transcoding."),
    workers: int | None = typer.Option(None, help="Parallel transcoding processes (CPU count)."),
    num_parts: int | None = typer.Option(None, help="Split the video list into N parts (one per node)."),
    part: int | None = typer.Option(None, help="Which part this process writes (0..N-1)."),
    limit: int | None = typer.Option(None, help="Only the first N videos after shuffling (trial runs)."),
    seed: int | None = typer.Option(None, help="Shuffle seed (also the seed of --split-ratios)."),
    split_ratios: str | None = typer.Option(None, help="folder: draw a split per class, 0.8,0.2 or 0.7,0.1,0.2."),
    group_by: str | None = typer.Option(None, help=r"Regex on file names kept in one split, e.g. '_g(\d+)_'."),
    engine: str | None = typer.Option(None, help="local (process pool) or ray (one Ray task per shard)."),
    ray_address: str | None = typer.Option(None, help="Ray cluster for --engine ray ('auto' after `ray start`)."),
    merge: bool = typer.Option(False, "--merge", help="Combine the manifests of all parts, then exit."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Transcode a dataset into webdataset tar shards of JPEG frames with Parquet manifests."""
    if merge:
        _need_dir(out, "output folder", "run the parts first, then --merge with the same --out")
        from moquad.preprocess import run

        run.merge(out)
        return
    from moquad.preprocess import splits

    cfg = C.resolve(
        C.PreprocessConfig(),
        recipe,
        dict(dataset=dataset, root=root, out=out, split=split, short_side=short_side, fps=fps,
             jpeg_quality=jpeg_quality, shard_size=shard_size, workers=workers, num_parts=num_parts,
             part=part, limit=limit, seed=seed, group_by=group_by, engine=engine, ray_address=ray_address,
             split_ratios=splits.parse_ratios(split_ratios) if split_ratios is not None else None),
        sets or (),
    )
    if _printed(cfg, print_config):
        return
    if not (cfg.dataset == "folder" and Path(cfg.root).is_file()):  # folder also takes a CSV/TSV list
        _need_dir(cfg.root, "dataset root", "pass the folder that holds the videos and annotation files")
    from moquad.preprocess import run

    run.preprocess(cfg)


@app.command(epilog="Example: moquad verify /data/shards/ucf101")
@_friendly
def verify(data: str = typer.Argument(..., help="A folder written by `moquad preprocess`.")) -> None:
    """Re-read every shard and check it against the manifests; exit 1 on any mismatch."""
    _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    from moquad.preprocess.manifest import verify as verify_dir

    problems = verify_dir(data)
    if problems:
        for p in problems:
            typer.echo(p, err=True)
        typer.echo(f"verify: {len(problems)} problem(s) in {data}", err=True)
        raise typer.Exit(1)
    typer.echo(f"verify: {data} OK")


@app.command(epilog="Example: moquad info data/mine --frames 16 --dilations 1,2,4 --json data/mine/info.json")
@_friendly
def info(
    data: str = typer.Argument(..., help="A folder written by `moquad preprocess`."),
    out: str | None = typer.Option(None, help="PNG to write (default DATA/info.png)."),
    frames: int | None = typer.Option(None, help="Clip length for the dilation-fit count (pre-train default)."),
    dilations: str | None = typer.Option(None, help="Dilations to check, e.g. 1,2,4 (pre-train default)."),
    json: str | None = typer.Option(None, "--json", help="Also write the numbers to this JSON file."),
) -> None:
    """What a preprocessed dataset holds: splits, classes, lengths, dilation fit, errors; table + one PNG."""
    _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    from moquad.info import info as run_info

    typer.echo(f"wrote {run_info(data, out, frames, dilations, json)}")


# ----------------------------------------------------------------------------- stage 2: pretrain


@app.command(
    epilog="Examples: moquad pretrain --data /data/shards/ucf101 --recipe train/ucf101_r3d18_moquad_dagger.yaml  |  "
    "moquad pretrain --data data/shards --recipe train/cpu_demo.yaml --method moquad --out runs/moquad  |  "
    "moquad pretrain --data data/shards --backbone tiny --size 64 --set loader.dilations=1,4 --set loader.grayscale=0  |  "
    "torchrun --nnodes 4 --nproc-per-node 8 ... -m moquad.cli pretrain --data ... --recipe ..."
)
@_friendly
def pretrain(
    data: str = typer.Option(..., help="Shard folder written by `moquad preprocess`."),
    out: str | None = typer.Option(None, help="Run folder (checkpoints, logs, config)."),
    recipe: str | None = typer.Option(None, help="YAML recipe (train/*.yaml); flags override it."),
    method: str | None = typer.Option(None, help="moquad, simclr (the ladder's base: MoQuad's sampling and loss, no quadruple parts) or simclr_classic (two clips at one dilation, NT-Xent)."),
    backbone: str | None = typer.Option(None, help="tiny, r3d_18, r2plus1d_18, s3d or r3d_50."),
    epochs: int | None = typer.Option(None, help="Training epochs."),
    batch_size: int | None = typer.Option(None, help="GLOBAL batch size in videos (split over ranks)."),
    lr: float | None = typer.Option(None, help="Learning rate at batch 256 (scaled linearly)."),
    lr_warmup_epochs: float | None = typer.Option(None, help="Linear learning-rate warm-up epochs (10)."),
    weight_decay: float | None = typer.Option(None, help="Weight decay (1e-6; none on BN and bias)."),
    optimizer: str | None = typer.Option(None, help="lars, sgd or adamw."),
    temperature: float | None = typer.Option(None, help="Softmax temperature tau."),
    warmup_ratio: float | None = typer.Option(None, help="Share of epochs on the appearance task (Alg. 1)."),
    hard_beta: float | None = typer.Option(None, help="Eq. 4: share of inter negatives mined as hard (0: off)."),
    hard_alpha: float | None = typer.Option(None, help="Eq. 4: weight of hard and intra negatives."),
    frames: int | None = typer.Option(None, help="Frames per clip."),
    size: int | None = typer.Option(None, help="Crop size in pixels."),
    appearance_op: str | None = typer.Option(None, help="rad_inter, rad_intra, be or none."),
    motion_op: str | None = typer.Option(None, help="speed, reverse or shuffle."),
    ad_pos: bool | None = typer.Option(None, "--ad-pos/--no-ad-pos", help="RAD on the positive."),
    intra_neg: bool | None = typer.Option(None, "--intra-neg/--no-intra-neg", help="Use the Intra-Neg."),
    ad_intra_neg: bool | None = typer.Option(None, "--ad-intra-neg/--no-ad-intra-neg", help="Use the AD-Intra-Neg."),
    workers: int | None = typer.Option(None, help="Data loader processes per rank."),
    augment_on_device: bool | None = typer.Option(None, "--augment-on-device/--augment-on-cpu",
                                                  help="Workers only decode; crop, flip, colour and RAD run on the GPU."),
    steps_per_epoch: int | None = typer.Option(None, help="Override batches per epoch."),
    ckpt_every: int | None = typer.Option(None, help="Checkpoint every N steps."),
    sync_bn: bool | None = typer.Option(None, "--sync-bn/--no-sync-bn", help="SyncBatchNorm across ranks."),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoints/last.pt."),
    seed: int | None = typer.Option(None, help="Seed for model init and data order (sets seed and loader.seed)."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Pre-train a video encoder with MoQuad (or the SimCLR baseline) from shards; any setting: --set KEY=VALUE."""
    cfg = C.resolve(
        C.PretrainConfig(),
        recipe,
        {
            "data": data, "out": out, "method": method, "backbone": backbone, "epochs": epochs,
            "batch_size": batch_size, "lr": lr, "lr_warmup_epochs": lr_warmup_epochs,
            "weight_decay": weight_decay, "optimizer": optimizer, "temperature": temperature,
            "warmup_ratio": warmup_ratio, "hard_beta": hard_beta, "hard_alpha": hard_alpha,
            "steps_per_epoch": steps_per_epoch, "ckpt_every": ckpt_every, "sync_bn": sync_bn,
            "resume": resume or None, "seed": seed, "device": device,
            "loader.frames": frames, "loader.size": size, "loader.appearance_op": appearance_op,
            "loader.motion_op": motion_op, "loader.ad_pos": ad_pos, "loader.intra_neg": intra_neg,
            "loader.ad_intra_neg": ad_intra_neg, "loader.workers": workers, "loader.seed": seed,
            "loader.augment_on_device": augment_on_device,
        },
        sets or (),
    )
    if _printed(cfg, print_config):
        return
    _need_dir(cfg.data, "data folder", "run `moquad preprocess` first and pass its --out folder")
    from moquad.train.loop import pretrain as run_pretrain

    ckpt = run_pretrain(cfg)
    typer.echo(f"checkpoint: {ckpt}")


@app.command(epilog="Example: moquad plot runs/moquad  (writes runs/moquad/curves.png)")
@_friendly
def plot(
    run: str = typer.Argument(..., help="A run folder of `moquad pretrain`."),
    out: str | None = typer.Option(None, help="PNG path (default RUN/curves.png)."),
) -> None:
    """Draw loss, learning rate and the Fig. 4 rank diagnostic of a run to a PNG."""
    _need_dir(run, "run folder", "pass the --out folder of `moquad pretrain`")
    from moquad.train.plot import plot_run

    typer.echo(f"wrote {plot_run(run, out)}")


# ----------------------------------------------------------------------------- everything


@app.command(epilog="Example: moquad quickstart --out runs/quickstart")
@_friendly
def quickstart(
    out: str = typer.Option("runs/quickstart", help="Folder for data, runs and the comparison."),
    epochs: int | None = typer.Option(None, help="Pre-training epochs for each method (60, train/cpu_demo.yaml)."),
    classes: int = typer.Option(4, help="Synthetic motion classes (types: 1-5, directions: 1-8; see moquad synth)."),
    per_class: int = typer.Option(100, help="Synthetic videos per class."),
    seed: int = typer.Option(0, help="Seed."),
    backbone: str | None = typer.Option(None, help="Backbone (tiny on CPU, the recipe's; r3d_18 on a GPU)."),
    kind: str = typer.Option("types", help="Synthetic family: types (motion types) or directions (senses)."),
) -> None:
    """Synth -> preprocess -> pretrain SimCLR and MoQuad -> retrieval, kNN and linear probe -> table + PNG."""
    from moquad.quickstart import quickstart as run_quickstart

    run_quickstart(out, epochs=epochs, classes=classes, per_class=per_class, seed=seed, backbone=backbone, kind=kind)


from moquad import cli_eval  # noqa: E402  (stage 3 lives in its own module)

app.registered_commands[-1:-1] = cli_eval.app.registered_commands  # evaluation commands before quickstart


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
