"""The ``moquad`` command line: each command parses options, builds a config, calls ONE function.

Run ``moquad COMMAND --help`` for the options and an example of each command. On a
cluster the same commands run under torchrun: ``torchrun ... -m moquad.cli pretrain ...``.
Settings: defaults < ``--recipe`` < flags < ``--set KEY=VALUE``; the flags are generated from the config
fields (:func:`moquad.cli_common.config_command`); errors: :mod:`moquad.cli_common`.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import typer

from moquad import config as C
from moquad import settings
from moquad.cli_common import (
    HELP_WIDTH,
    RECIPE,
    CommandList,
    Flag,
    HelpCommand,
    OneLineTyper,
    _default_of,
    _friendly,
    _need_dir,
    config_command,
    flag_help,
    global_options,
)
from moquad.errors import MoquadError
from moquad.preprocess.datasets import DATASETS
from moquad.quickstart import quickstart as run_quickstart
from moquad.synth import make_synth
from moquad.train import methods

app = OneLineTyper(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's own help layout: each option's help wraps beside it in the terminal's width (up to 120 columns), a
    # long option name puts its help on the next line; rich's panels squeezed the help of a command with many
    # flags into a narrow column
    rich_markup_mode=None,
    context_settings={"max_content_width": HELP_WIDTH},
    cls=CommandList,
    help="MoQuad: shard videos, pre-train motion-focused video encoders, evaluate them honestly.\n\n"
    "Stages: synth -> preprocess -> verify -> pretrain -> extract / retrieve / linear / finetune / cam. "
    "`moquad quickstart` runs them all on generated data.",
)


def _print_version(value: bool) -> None:
    if value:
        from moquad import __version__

        typer.echo(f"moquad {__version__}")
        raise typer.Exit()


def _options(
    debug: bool = inspect.signature(global_options).parameters["debug"].default,
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print moquad's version and exit."),
) -> None:
    """The options before the command name (``moquad --debug pretrain ...``, ``moquad --version``)."""
    global_options(debug)


app.callback(epilog="Example: moquad --debug pretrain --data D  (or: MOQUAD_DEBUG=1 moquad ...)")(_options)


# ----------------------------------------------------------------------------- stage 0: data


@app.command(epilog="Examples: moquad synth data/synth --classes 4 --per-class 8 --size 64 --frames 48 --objects 3  |  "
             "moquad synth data/dirs --kind directions --classes 4  (Up, Down, ZoomIn, ZoomOut: well posed with flips on)  |  "
             "moquad synth data/dirs8 --kind directions --classes 8  (adds Left/Right, Clockwise/CounterClockwise: "
             "pre-train with --set loader.flip=shared or none)  |  "
             "moquad synth data/still --kind directions --camera-drift 0  (the same videos, camera still)  |  "
             "moquad synth data/cam --kind camera --source ~/videos/real --per-class 100 --size 48  (a folder of a few "
             "real videos of yours: phone clips, or a few UCF101 or Kinetics clips)")
@_friendly
def synth(
    out: str = typer.Argument(..., help="Folder to write the UCF101-layout dataset into."),
    kind: str = typer.Option(_default_of(make_synth, "kind"), help="Family: 'types' (class = motion type: Translate, "
                             "Rotate, Scale, Oscillate, Orbit), 'directions' (class = direction or sense of one motion: "
                             "Up, Down, ZoomIn, ZoomOut, Left, Right, Clockwise, CounterClockwise; 1/f textures, random "
                             "camera drift) or 'camera' (PanLeft, PanRight, ZoomIn, ZoomOut, PanUp, PanDown cut from the "
                             "real videos of --source; train and test from different source videos). A horizontal flip "
                             "maps Left<->Right: pre-train such classes with --set loader.flip=shared."),
    source: str | None = typer.Option(None, help="--kind camera: a folder of real videos to cut the camera motions from "
                                  "(at least 2: your own, or a few clips of UCF101 or Kinetics)."),
    classes: int = typer.Option(_default_of(make_synth, "classes"), help="Number of classes, the first N of the "
                                "family (types: 1-5, directions: 1-8, camera: 1-6)."),
    per_class: int = typer.Option(_default_of(make_synth, "per_class"), help="Videos per class."),
    size: int = typer.Option(_default_of(make_synth, "size"), help="Frame width and height in pixels."),
    frames: int = typer.Option(_default_of(make_synth, "frames"), help="Frames per video (25 fps)."),
    objects: int = typer.Option(_default_of(make_synth, "objects"), help="Moving objects per video (all with the "
                                "class's motion)."),
    seed: int = typer.Option(_default_of(make_synth, "seed"), help="Random seed."),
    camera_drift: float = typer.Option(_default_of(make_synth, "camera_drift"), help="--kind directions: the largest "
                                       "class-free camera drift, pixels per frame at 64 px (0: a still camera; the "
                                       "videos are otherwise the same for a seed)."),
) -> None:
    """Generate a synthetic motion dataset (classes differ ONLY by motion) in UCF101's layout."""
    root = make_synth(out, classes=classes, per_class=per_class, size=size, frames=frames, seed=seed,
                      objects=objects, kind=kind, source=source, camera_drift=camera_drift)
    typer.echo(f"wrote {classes * per_class} videos to {root} (UCF101 layout; preprocess with `moquad preprocess ucf101 {root} --out DIR`)")


# ----------------------------------------------------------------------------- stage 1: preprocess


def _layouts() -> str:
    return "\n\n".join(f"{name}: {a.layout}" for name, a in DATASETS.items())


_OFFICIAL = {name: a.official_splits for name, a in DATASETS.items() if a.official_splits}


def _ratios(text: str) -> tuple[float, ...]:
    from moquad.preprocess.splits import parse_ratios

    return parse_ratios(text)


PREPROCESS_FLAGS = (
    Flag("dataset", argument=True), Flag("root", argument=True), Flag("out", decls=("--out", "-o"), required=True),
    RECIPE,
    # --split, its earlier name, stays as a hidden alias: --split elsewhere names a manifest split
    Flag("official_split", alias="--split", help="Which official train/test split of " + ", ".join(_OFFICIAL)
         + ". One of: " + ", ".join(map(str, sorted({n for s in _OFFICIAL.values() for n in s}))) + "."),
    *map(Flag, ("short_side", "fps", "jpeg_quality", "shard_size", "workers", "num_parts", "part", "limit", "seed")),
    Flag("split_ratios", parse=_ratios), *map(Flag, ("group_by", "engine", "ray_address")))


@config_command(app, "preprocess", C.PreprocessConfig, PREPROCESS_FLAGS, stage="preprocess", epilog=(
    "Examples: moquad preprocess ucf101 /data/UCF101 --out /data/shards/ucf101 --official-split 1  |  "
    "moquad preprocess folder ~/my_videos --out data/mine --split-ratios 0.8,0.2  (class sub-folders)  |  "
    "moquad preprocess folder ~/my_videos/list.csv --out data/mine  (rows path,label[,split])  |  "
    "moquad preprocess k400 /data/k400 --out /data/shards/k400 --recipe k400 --num-parts 8 --part 3  |  "
    "moquad preprocess k400 /data/k400 --out /data/shards/k400 --merge  |  "
    "moquad preprocess folder /data/clips --out /data/shards/clips --set jpeg_quality=95\n\n"
    f"Layouts (what ROOT must hold):\n\n{_layouts()}"))
def preprocess(cfg: C.PreprocessConfig,
               merge: bool = typer.Option(False, "--merge", help="Combine the manifests of all parts, then exit.")
               ) -> None:
    """Transcode a dataset into webdataset tar shards of JPEG frames with Parquet manifests."""
    from moquad.preprocess import run

    if merge:
        _need_dir(cfg.out, "output folder", "run the parts first, then --merge with the same --out")
        run.merge(cfg.out)
        return
    if not (cfg.dataset == "folder" and Path(cfg.root).is_file()):  # folder also takes a CSV/TSV list
        _need_dir(cfg.root, "dataset root", "pass the folder that holds the videos and annotation files")
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
    frames: int | None = typer.Option(None, help=flag_help(C.LoaderConfig, "frames", "Clip length for the "
                                                             "dilation-fit count (pre-training's).")),
    dilations: str | None = typer.Option(None, help=flag_help(C.LoaderConfig, "dilations", "Dilations to check, "
                                                                "comma-separated (pre-training's).")),
    json: str | None = typer.Option(None, "--json", help="Also write the numbers to this JSON file."),
) -> None:
    """What a preprocessed dataset holds: splits, classes, lengths, dilation fit, errors; table + one PNG."""
    _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    from moquad.info import info as run_info

    typer.echo(f"wrote {run_info(data, out, frames, dilations, json)}")


@app.command(epilog="Examples: moquad recipes  |  moquad recipes --stage train  |  "
             "moquad pretrain --data D --recipe ucf101_r3d18_moquad")
@_friendly
def recipes(stage: str | None = typer.Option(None, help="Only this stage's recipes: preprocess, train or eval.")) -> None:
    """List the recipes shipped with moquad (name, stage, description); pass a name to --recipe."""
    from rich.console import Console
    from rich.table import Table

    from moquad.recipes import STAGES, list_recipes

    if stage is not None and stage not in STAGES:
        raise ValueError(f"--stage {stage!r}: choose one of {', '.join(STAGES)}")
    table = Table("name", "stage", "description", title="recipes (moquad COMMAND --recipe NAME)")
    for r in list_recipes():
        if stage in (None, r["stage"]):
            table.add_row(r["name"], r["stage"], r["description"])
    Console(width=max(120, Console().width)).print(table)


# ----------------------------------------------------------------------------- stage 2: pretrain


METHOD_HELP = methods.help_text()  # from the table: each row's summary
PRETRAIN_FLAGS = (
    Flag("data"), Flag("split"), Flag("out"), RECIPE,
    Flag("method", help=f"Pre-training method, one of {METHOD_HELP}."),
    *map(Flag, ("backbone", "model_input", "proj_dim", "proj_hidden", "epochs", "batch_size", "lr",
                "lr_warmup_epochs", "weight_decay", "optimizer", "temperature", "warmup_ratio", "hard_beta",
                "hard_alpha", "momentum", "queue_size", "predictor", "symmetric", "key_bn", "key_bn_group")),
    *(Flag("loader." + k) for k in ("frames", "size", "appearance_op", "motion_ops", "ad_pos", "intra_neg",
                                    "ad_intra_neg", "workers")),
    Flag("loader.augment_on_device", decls=("--augment-on-device/--augment-on-cpu",)),
    *map(Flag, ("steps_per_epoch", "ckpt_every", "log_every", "sync_bn")),
    Flag("resume", decls=("--resume",), help="Continue the run in --out from its last checkpoint with its own "
         "settings (OUT/config.yaml); flags and --set apply over them, unless they change what it trained."),
    Flag("seed", also=("loader.seed",)), Flag("device"))


def _resumed(cfg: C.PretrainConfig) -> C.PretrainConfig | None:
    """``--resume``: the settings the run in ``cfg.out`` was trained with (its ``config.yaml``), the config that
    the recipe, flags and ``--set`` then apply over; None for a new run."""
    saved = Path(cfg.out) / "config.yaml"
    if not cfg.resume or not saved.is_file():
        return None
    import yaml

    try:
        return C.update(C.PretrainConfig(), yaml.safe_load(saved.read_text()) or {})
    except (C.ConfigError, yaml.YAMLError) as e:
        why = settings.with_suggestion(C.PretrainConfig(), e) if isinstance(e, C.ConfigError) else e
        raise C.ConfigError("resume", "", f"cannot resume {cfg.out}: its settings ({saved}) do not load: "
                            f"{' '.join(str(why).split())}; use a new --out") from None


@config_command(app, "pretrain", C.PretrainConfig, PRETRAIN_FLAGS, stage="train", start=_resumed, epilog=(
    "Examples: moquad pretrain --data /data/shards/ucf101 --recipe ucf101_r3d18_moquad_dagger  |  "
    "moquad pretrain --data data/shards --recipe train/cpu_demo.yaml --method moquad --out runs/moquad  |  "
    "moquad pretrain --data data/shards --backbone tiny --size 64 --set loader.dilations=1,4 --set loader.grayscale=0  |  "
    "moquad pretrain --out runs/moquad --resume  |  "
    "torchrun --nnodes 4 --nproc-per-node 8 ... -m moquad.cli pretrain ..."))
def pretrain(cfg: C.PretrainConfig) -> None:
    """Pre-train a video encoder with MoQuad (or the SimCLR baseline) from shards; any setting: --set KEY=VALUE."""
    if not cfg.data:
        raise MoquadError("pretrain needs --data DIR, the --out folder of `moquad preprocess`")
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
    epochs: int | None = typer.Option(None, help="Pre-training epochs for each method (default: the demo recipe's, "
                                      "train/cpu_demo.yaml)."),
    classes: int = typer.Option(_default_of(run_quickstart, "classes"), help="Synthetic motion classes (types: 1-5, "
                                "directions: 1-8; see moquad synth)."),
    per_class: int = typer.Option(_default_of(run_quickstart, "per_class"), help="Synthetic videos per class."),
    seed: int = typer.Option(_default_of(run_quickstart, "seed"), help="Seed."),
    backbone: str | None = typer.Option(None, help="Backbone (tiny on CPU, the recipe's; r3d_18 on a GPU)."),
    kind: str = typer.Option(_default_of(run_quickstart, "kind"), help="Family: types (motion types), directions "
                             "(senses) or camera (real footage, --source)."),
    source: str | None = typer.Option(None, help="--kind camera: a folder of real videos."),
) -> None:
    """Synth -> preprocess -> pretrain SimCLR and MoQuad -> retrieval, kNN and linear probe -> table + PNG."""
    run_quickstart(out, epochs=epochs, classes=classes, per_class=per_class, seed=seed, backbone=backbone, kind=kind,
                   source=source)


from moquad import cli_eval  # noqa: E402  (stage 3 lives in its own module)

app.registered_commands[-1:-1] = cli_eval.app.registered_commands  # evaluation commands before quickstart
for _info in app.registered_commands:  # each command's --help in Click's layout, lines broken between words
    _info.cls = HelpCommand if _info.cls in (None, typer.core.TyperCommand) else _info.cls


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
