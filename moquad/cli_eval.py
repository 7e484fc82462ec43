"""The evaluation commands of the ``moquad`` CLI (stage 3): extract, retrieve, linear, finetune, cam, export.

Registered on the main app by ``moquad.cli``; same conventions: parse options, build a config, call ONE function.
Flags come from the configs (:func:`moquad.cli_common.config_command`): each protocol's named flags are the
``EvalConfig`` settings its row of :data:`moquad.eval.protocols.PROTOCOLS` reads, with the help written on the
field in :mod:`moquad.config`. Every other setting is reachable with ``--set``.
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

app = typer.Typer()

_CKPT_HINT = "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)"
_JSON_HELP = ("Also write a copy of the result JSON to this file (the result and its text table always go to "
              "RUN/eval, or --out).")


def _json_option() -> Any:
    return typer.Option(None, "--json", help=_JSON_HELP)


def _wrote(result: dict[str, Any], json_path: str | None) -> None:
    """The line that says where a result went: RUN/eval (JSON and text table), and the --json copy."""
    path = Path(result["json"])
    copy = f"; copy: {json_path}" if json_path else ""
    typer.echo(f"wrote {path} and {path.with_suffix('.txt').name}{copy}")


def _checked(name: str) -> Callable[[C.EvalConfig], None]:
    """The paths protocol ``name`` reads exist; a checkpoint is given unless fine-tuning starts from random init."""

    def check(cfg: C.EvalConfig) -> None:
        _need_dir(cfg.data, "data folder", "run `moquad preprocess` first and pass its --out folder")
        if cfg.checkpoint:
            _need_file(cfg.checkpoint, "checkpoint", _CKPT_HINT)
        elif not (name == "finetune" and cfg.finetune.init == "random"):
            raise MoquadError(f"{name} needs --checkpoint RUN/checkpoints/last.pt (a .pt written by `moquad pretrain`)")

    return check


def protocol_command(name: str, epilog: str, checkpoint_help: str | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register ``body(cfg, **own_options)`` as command ``name``: data, checkpoint, recipe, the protocol's
    named flags (from :data:`PROTOCOLS`), the body's own options, ``--set`` and ``--print-config``."""

    def wrap(body: Callable[..., Any]) -> Any:
        @functools.wraps(body)
        def run_body(cfg: C.EvalConfig, **kw: Any) -> None:
            try:
                body(cfg, **kw)
            finally:  # under torchrun: the gloo / NCCL group ends before the interpreter does
                from moquad import dist

                dist.cleanup()

        flags = (Flag("data", required=True), Flag("checkpoint", help=checkpoint_help), RECIPE,
                 *map(Flag, PROTOCOLS[name].flags))
        config_command(app, name, C.EvalConfig, flags, epilog=epilog, stage="eval", check=_checked(name))(run_body)
        return body

    return wrap


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


@protocol_command("finetune", "Examples: moquad finetune --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --recipe eval/finetune_ucf101.yaml  |  moquad finetune --data "
                  "data/shards --init random --backbone tiny --recipe eval/cpu_demo.yaml --out bound  (the supervised "
                  "bound at the demo's size)",
                  checkpoint_help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt); optional with "
                                  "--init random --backbone NAME.")
def finetune(cfg: C.EvalConfig, json: str | None = _json_option()) -> None:
    """Fine-tune the whole network; multi-clip test, per-class table and confusion matrix.

    Defaults: the paper's protocol (100 epochs, batch 32, LARS 0.08) at the checkpoint's pre-training clip; its
    10-clip x 3-crop test: --recipe eval/finetune_<dataset>.yaml. --init random trains the same backbone from
    random init: the supervised bound."""
    _wrote(run("finetune", cfg, json_path=json), json)


def _cam_paths(cfg: C.EvalConfig) -> None:
    _need_file(cfg.checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain`")
    if cfg.data:
        _need_dir(cfg.data, "data folder", "pass the --out folder of `moquad preprocess`")


@config_command(app, "cam", C.EvalConfig, (
    "video", Flag("checkpoint", required=True), Flag("data", help="Shard folder (needed when VIDEO is a video_id)."),
    "out", Flag("frames"), Flag("size"), "method",
    Flag("out", decls=("--eval-dir",), help="Folder of `moquad finetune` results (to find its classifier)."),
    Flag("device")), check=_cam_paths,
    epilog="Example: moquad cam data/UCF-101/Fencing/v_Fencing_g01_c01.avi --data /data/shards/ucf101 "
    "--checkpoint runs/moquad/checkpoints/last.pt --out cam.png")
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
