"""The evaluation commands of the ``moquad`` CLI (stage 3): extract, retrieve, linear, attentive, finetune, cam, export,
motion.

Registered on the main app by ``moquad.cli``; same conventions: parse options, build a config, call ONE function.
Every protocol command is made the same way (:func:`protocol_command`) from its row of
:data:`moquad.eval.protocols.PROTOCOLS`: ``--data``, ``--checkpoint`` when the row reads one, ``--recipe`` when its
config has recipes, and the settings the row names as flags (:func:`moquad.cli_common.config_command`), with the
help written on the field in :mod:`moquad.config`; a command states only its own options and where a flag is spelt
differently. Every other setting is reachable with ``--set``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from moquad import config as C
from moquad.cli_common import RECIPE, Flag, _need_dir, _need_file, config_command
from moquad.errors import MoquadError
from moquad.eval.protocols import PROTOCOLS, run
from moquad.models.backbones import TORCHVISION_ARCHS
from moquad.settings import RECIPE_KINDS

app = typer.Typer()

_CKPT_HINT = "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)"
_ENCODER_HELP = ("The encoder to evaluate: a checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt), an export "
                 "(FILE.safetensors), torchvision:ARCH[:WEIGHTS] or hf:FOLDER_OR_HUB_NAME (docs: Evaluate any "
                 "encoder). Its native clip fills --frames/--size/--dilation when unset.")
_JSON_HELP = ("Also write a copy of the result JSON to this file (the result and its text table always go to "
              "RUN/eval, or --out).")


def _json_option() -> Any:
    return typer.Option(None, "--json", help=_JSON_HELP)


def _wrote(result: dict[str, Any], json_path: str | None) -> None:
    """The line that says where a result went: RUN/eval (JSON and text table), and the --json copy."""
    path = Path(result["json"])
    copy = f"; copy: {json_path}" if json_path else ""
    typer.echo(f"wrote {path} and {path.with_suffix('.txt').name}{copy}")


def _checked(name: str) -> Callable[[Any], None]:
    """The paths protocol ``name`` reads exist: its data folder (when required or given) and its checkpoint (when
    given; else one is needed when its row says so: not for fine-tuning from random init)."""
    row = PROTOCOLS[name]

    def check(cfg: Any) -> None:
        if row.needs_data or cfg.data:
            _need_dir(cfg.data, "data folder", "run `moquad preprocess` first and pass its --out folder")
        if row.needs_checkpoint is None:
            return
        if cfg.checkpoint and row.encoders:
            _check_encoder(cfg, row.results)
        elif cfg.checkpoint:
            _need_file(cfg.checkpoint, "checkpoint", _CKPT_HINT)
        elif row.needs_checkpoint(cfg):
            raise MoquadError(f"{name} needs --checkpoint RUN/checkpoints/last.pt (a .pt written by `moquad pretrain`)")

    return check


def _check_encoder(cfg: Any, results: bool) -> None:
    """The encoder name loads (once: the protocol gets the same one), takes the clip, and has a place for its
    results (``results``: the protocol writes them to the evaluation folder), before anything is written."""
    from moquad.eval.common import frozen_encoder, out_dir, with_clip

    with_clip(cfg, frozen_encoder(cfg.checkpoint))
    if results:
        out_dir(cfg)


def protocol_flags(name: str, first: tuple[str, ...] = (), spelt: dict[str, Flag] | None = None) -> tuple:
    """The options of protocol ``name``'s command, from its row: the body's own options named in ``first``
    (arguments), ``--data``, ``--checkpoint`` (rows that read one), ``--recipe`` (configs with recipes), then the
    row's settings; ``spelt``: the flags this command spells differently (help, option name, repeated)."""
    row, spelt = PROTOCOLS[name], spelt or {}
    inputs = [*first, spelt.get("data", Flag("data", required=row.needs_data))]
    if row.needs_checkpoint is not None:
        default = (Flag("checkpoint", decls=("--checkpoint", "--encoder"), help=_ENCODER_HELP) if row.encoders
                   else Flag("checkpoint"))
        inputs.append(spelt.get("checkpoint", default))
    if row.config in RECIPE_KINDS:
        inputs.append(RECIPE)
    return (*inputs, *(spelt.get(key, Flag(key)) for key in row.flags))


def protocol_command(name: str, epilog: str, flags: tuple | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register ``body(cfg, **own_options)`` as command ``name``: ``flags`` (default: :func:`protocol_flags` of
    its row), the body's other own options, ``--set`` and ``--print-config``."""

    def wrap(body: Callable[..., Any]) -> Any:
        @functools.wraps(body)
        def run_body(cfg: Any, **kw: Any) -> None:
            try:
                body(cfg, **kw)
            finally:  # under torchrun: the gloo / NCCL group ends before the interpreter does
                from moquad import dist

                dist.cleanup()

        config_command(app, name, PROTOCOLS[name].config, flags or protocol_flags(name), epilog=epilog,
                       stage="eval", check=_checked(name))(run_body)
        return body

    return wrap


# the protocol commands that spell a flag their own way
FINETUNE_FLAGS = protocol_flags("finetune", spelt={"checkpoint": Flag(
    "checkpoint", decls=("--checkpoint", "--encoder"), help=f"{_ENCODER_HELP} Fine-tuned end to end under a linear "
    "head; optional with --init random --backbone NAME.")})
CAM_FLAGS = protocol_flags("cam", ("video",), {
    "checkpoint": Flag("checkpoint", decls=("--checkpoint", "--encoder"), required=True, help=f"{_ENCODER_HELP} "
                       "A CNN's map is its last feature map, a transformer's its token grid."),
    "data": Flag("data", help="Shard folder (needed when VIDEO is a video_id)."),
    "out": Flag("out", decls=("--eval-dir",), help="Folder of `moquad finetune` results (to find its classifier).")})
MOTION_FLAGS = protocol_flags("motion", ("encoders", "checkpoint"), {"pair": Flag("pair", multiple=True)})


@protocol_command("extract", "Examples: moquad extract --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --split test  |  moquad extract --data D --checkpoint C --crops 3 "
                  "--set workers=8")
def extract(cfg: C.EvalConfig, split: str = typer.Option("test", help="Split to extract."),
            force: bool = typer.Option(False, "--force", help="Re-extract even when a matching cache exists.")) -> None:
    """Extract per-video backbone features (multi-clip average) into a Lance dataset."""
    typer.echo(f"features: {run('extract', cfg, split=split, force=force)}")


@protocol_command("retrieve", "Examples: moquad retrieve --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --json retrieval.json --knn-k 20 --knn-t 0.07  |  moquad retrieve "
                  "--data data/shards --checkpoint CKPT --recipe eval/cpu_demo.yaml --set ks=1,5")
def retrieve(cfg: C.EvalConfig, json: str | None = _json_option()) -> None:
    """Nearest-neighbour retrieval (the test split queries the train split; hit@k for k in ks) and weighted-kNN
    accuracy. The clip is the checkpoint's pre-training clip unless --frames/--size/--dilation or a recipe set it."""
    _wrote(run("retrieve", cfg, json_path=json, overwrite=True), json)  # a command's run replaces its result


@protocol_command("linear", "Examples: moquad linear --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --fast  |  moquad linear --full --data /data/shards/ucf101 "
                  "--checkpoint C --recipe eval/linear_ucf101.yaml  |  moquad linear --data data/shards --checkpoint C "
                  "--size 32 --frames 8 --num-clips 5")
def linear(cfg: C.EvalConfig, fast: bool = typer.Option(True, "--fast/--full", help="Cached features (fast) or the "
                                                         "CVRL protocol on clips (full)."),
           json: str | None = _json_option()) -> None:
    """Linear probe on the frozen backbone (its weights and BN statistics are checked unchanged).

    --full is the paper's protocol with --recipe eval/linear_<dataset>.yaml (32-frame clips, as the paper's)."""
    _wrote(run("linear", cfg, fast=fast, json_path=json, overwrite=True), json)


@protocol_command("attentive", "Examples: moquad attentive --data /data/shards/ssv2 --encoder "
                  "hf:facebook/vjepa2-vitl-fpc64-256 --recipe eval/attentive_ssv2.yaml --out runs/vjepa2  |  moquad "
                  "attentive --data data/shards --checkpoint runs/moquad/checkpoints/last.pt --set attentive.heads=4")
def attentive(cfg: C.EvalConfig, json: str | None = _json_option()) -> None:
    """Attentive probe on the frozen encoder's tokens (V-JEPA 2's: a learnt query, cross-attention, a linear layer;
    AdamW on tokens extracted once); multi-clip test, per-class table.

    Its recipe eval/attentive_ssv2.yaml is V-JEPA 2's SSv2 protocol (facebookresearch/vjepa2, configs/eval/vitl)."""
    _wrote(run("attentive", cfg, json_path=json, overwrite=True), json)


@protocol_command("finetune", "Examples: moquad finetune --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --recipe eval/finetune_ucf101.yaml  |  moquad finetune --data "
                  "data/shards --init random --backbone tiny --recipe eval/cpu_demo.yaml --out bound  (the supervised "
                  "bound at the demo's size)",
                  FINETUNE_FLAGS)
def finetune(cfg: C.EvalConfig, json: str | None = _json_option()) -> None:
    """Fine-tune the whole network; multi-clip test, per-class table and confusion matrix.

    Defaults: the paper's protocol (100 epochs, batch 32, LARS 0.08) at the checkpoint's pre-training clip; its
    10-clip x 3-crop test: --recipe eval/finetune_<dataset>.yaml. --init random trains the same backbone from
    random init: the supervised bound."""
    _wrote(run("finetune", cfg, json_path=json, overwrite=True), json)


@protocol_command("cam", "Examples: moquad cam data/UCF-101/Fencing/v_Fencing_g01_c01.avi --data /data/shards/ucf101 "
                  "--checkpoint runs/moquad/checkpoints/last.pt --out cam.png  |  moquad cam VIDEO --encoder "
                  "torchvision:r3d_18:r3d18.pth --out cam.png", CAM_FLAGS)
def cam(
    cfg: C.EvalConfig,
    video: str = typer.Argument(..., help="A video file, or a video_id of --data."),
    out: str = typer.Option("cam.png", help="PNG image strip to write."),
    method: str = typer.Option("auto", help="auto (fine-tuned classifier if found, else projection), classifier, "
                               "projection or norm."),
) -> None:
    """Class-activation maps over a video's frames, saved as an image strip (the paper's Fig. 5)."""
    typer.echo(f"wrote {run('cam', cfg, video=video, out=out, method=method)}")


@config_command(app, "export", C.ExportConfig, (
    Flag("checkpoint", argument=True, option="--checkpoint"), Flag("format"),
    Flag("out", decls=("--out", "-o"), required=True)),
    epilog="Example: moquad export runs/moquad/checkpoints/last.pt --format torchvision --out r3d18.pt, then "
    "model = torchvision.models.video.r3d_18(); model.fc = torch.nn.Identity(); "
    "model.load_state_dict(torch.load('r3d18.pt')); model card: r3d18.json. --format torchvision fits "
    f"{', '.join(TORCHVISION_ARCHS)} (the backbone table's torchvision rows)")
def export(cfg: C.ExportConfig) -> None:
    """Export the pre-trained backbone (torchvision names or safetensors) with a JSON model card."""
    _need_file(cfg.checkpoint, "checkpoint", _CKPT_HINT)
    from moquad.export import export as run_export

    weights, card = run_export(cfg.checkpoint, cfg.format, cfg.out)
    import json

    from moquad.eval.common import eval_folder

    for s in json.loads(card.read_text())["eval"].get("skipped", []):
        typer.echo(f"skipped {eval_folder(cfg.checkpoint) / s['file']} (not in the card): {s['reason']}")
    typer.echo(f"wrote {weights} and its model card {card}")


@protocol_command("motion", "Example: moquad motion --data data/shards random=runs/random/checkpoints/last.pt "
                  "runs/simclr/checkpoints/last.pt runs/moquad/checkpoints/last.pt --out runs/motion  (writes motion.json, "
                  "motion.txt and motion.png)  |  moquad motion --data data/shards hf:facebook/vjepa2-vitl-fpc64-256 "
                  "torchvision:r3d_18:KINETICS400_V1 --out runs/motion-peers  (both at V-JEPA 2's clip)", MOTION_FLAGS)
def motion(
    cfg: C.MotionConfig,
    encoders: list[str] = typer.Argument(None, help="Encoders, each [LABEL=]NAME: a moquad checkpoint "
                                         "(RUN/checkpoints/last.pt), an exported .safetensors, torchvision:ARCH[:WEIGHTS] "
                                         f"(ARCH: {', '.join(TORCHVISION_ARCHS)}) or hf:FOLDER_OR_HUB_NAME, all at "
                                         "one clip: the first moquad encoder's pre-training clip, else the first "
                                         "encoder's native clip, unless a flag sets one.", show_default=False),
    checkpoint: list[str] = typer.Option(None, "--checkpoint", "--encoder", help="An encoder as ENCODERS takes it, "
                                         "repeatable; reported after those given as arguments.", show_default=False),
) -> None:
    """Motion report: arrow of time, speed, mirror, appearance share and direction pairs of frozen encoders."""
    encoders = [*(encoders or ()), *(checkpoint or ())]
    if not encoders:
        raise MoquadError("motion needs at least one encoder: RUN/checkpoints/last.pt as an argument or --checkpoint")
    result = run("motion", cfg, encoders=encoders)
    json_path = Path(result["json"])
    typer.echo(f"wrote {json_path}, {json_path.with_suffix('.txt')} and {result['png']} ({result['seconds']:.0f} s)")
