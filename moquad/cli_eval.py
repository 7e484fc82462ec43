"""The evaluation commands of the ``moquad`` CLI (stage 3): extract, retrieve, linear, finetune, cam, export.

Registered on the main app by ``moquad.cli``; same conventions: parse options, build a config, call ONE function.
Each protocol's named flags are generated from its row of :data:`moquad.eval.protocols.PROTOCOLS` (which
``EvalConfig`` settings it reads) and the help texts below, declared once; the default shown is the
config's. Every other setting is reachable with ``--set``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

from moquad import config as C
from moquad import settings
from moquad.cli_common import _PRINT, _RECIPE, _SET, _friendly, _need_dir, _need_file, _printed, _recipe
from moquad.errors import MoquadError
from moquad.eval.protocols import PROTOCOLS, run

app = typer.Typer()

# help of every named evaluation flag (the key is the EvalConfig setting, dotted for nested ones)
HELP = {
    "train_split": "Manifest split to train on (retrieval: the gallery).",
    "test_split": "Manifest split to test on (retrieval: the queries); the SSv2 and K400 recipes set val.",
    "num_clips": "Uniformly spaced test clips per video.",
    "frames": "Frames per clip.",
    "dilation": "Frame step inside a clip.",
    "size": "Crop size; use the pre-training size.",
    "crops": "Test crops per clip: 1 (centre) or 3 (the paper's action-recognition test).",
    "batch_size": "Test views per forward pass.",
    "out": "Folder for features and results (default: RUN/eval beside the checkpoint).",
    "device": "auto, cpu or cuda.",
    "center": "Subtract each split's mean, then L2-normalise.",
    "index": "exact, or lance (vector index; its recall is reported).",
    "knn_k": "Weighted kNN (DINO): neighbours that vote.",
    "knn_t": "Weighted kNN (DINO): a vote weighs exp(cosine / T).",
    "linear.epochs": "Training epochs (--full).",
    "linear.lr": "Learning rate (--full).",
    "linear.batch_size": "Training clips per step (--full).",
    "finetune.init": "checkpoint (pre-trained weights) or random (the supervised bound: same backbone, labels only).",
    "finetune.backbone": "Backbone; the checkpoint's by default; with --init random it makes --checkpoint optional.",
    "finetune.epochs": "Training epochs.",
    "finetune.lr": "Learning rate (as given, not scaled with the batch).",
    "finetune.batch_size": "Global training batch.",
}


def _flag(key: str) -> inspect.Parameter:
    """The typer option of EvalConfig setting ``key``; None means 'not given' (recipe or default stand)."""
    cfg, name = C.EvalConfig(), key
    if "." in key:
        outer, name = key.split(".")
        cfg = getattr(cfg, outer)
    tp, _ = C.unwrap_optional(C.type_hints(type(cfg))[name])
    flag = "--" + name.replace("_", "-")
    decl = f"{flag}/--no-{flag[2:]}" if tp is bool else flag
    default = getattr(cfg, name)
    option = typer.Option(None, decl, help=HELP[key], show_default="none" if default is None else str(default))
    return inspect.Parameter(key.replace(".", "__"), inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=tp | None)


def _common(checkpoint_help: str) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter("data", kw, default=typer.Option(..., help="Shard folder of the evaluation dataset."),
                              annotation=str),
            inspect.Parameter("checkpoint", kw, default=typer.Option("", help=checkpoint_help), annotation=str),
            inspect.Parameter("recipe", kw, default=_RECIPE, annotation=str | None)]


def build_config(name: str, data: str, checkpoint: str, recipe: str | None, sets: list[str] | None,
                 flags: dict[str, Any]) -> C.EvalConfig:
    """defaults < recipe < flags (None: not given) < ``--set``; the paths a protocol needs must exist."""
    _need_dir(data, "data folder", "run `moquad preprocess` first and pass its --out folder")
    if checkpoint:
        _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)")
    cfg = settings.resolve(C.EvalConfig(), _recipe(recipe, "eval"), dict(data=data, checkpoint=checkpoint, **flags),
                           sets or ())
    if not cfg.checkpoint and not (name == "finetune" and cfg.finetune.init == "random"):
        raise MoquadError(f"{name} needs --checkpoint RUN/checkpoints/last.pt (a .pt written by `moquad pretrain`)")
    return cfg


def protocol_command(name: str, epilog: str, checkpoint_help: str = "Checkpoint of `moquad pretrain` "
                     "(RUN/checkpoints/last.pt).") -> Callable[[Callable[..., Any]], Any]:
    """Register ``body(cfg, **own_options)`` as command ``name``: data, checkpoint, recipe, the protocol's
    named flags (from :data:`PROTOCOLS`), the body's own options, ``--set`` and ``--print-config``."""

    def wrap(body: Callable[..., Any]) -> Any:
        own = list(inspect.signature(body, eval_str=True).parameters.values())[1:]
        keys = PROTOCOLS[name].flags

        def command(**kw: Any) -> None:
            flags = {k: kw.pop(k.replace(".", "__")) for k in keys}
            cfg = build_config(name, kw.pop("data"), kw.pop("checkpoint"), kw.pop("recipe"), kw.pop("sets"), flags)
            if not _printed(cfg, kw.pop("print_config")):
                try:
                    body(cfg, **kw)
                finally:  # under torchrun: the gloo / NCCL group ends before the interpreter does
                    from moquad import dist

                    dist.cleanup()

        params = [*_common(checkpoint_help), *map(_flag, keys),
                  *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own),
                  inspect.Parameter("sets", inspect.Parameter.KEYWORD_ONLY, default=_SET, annotation=list[str] | None),
                  inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=_PRINT, annotation=bool)]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__name__, command.__doc__ = name, body.__doc__
        app.command(name, epilog=epilog)(_friendly(command))
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
def retrieve(cfg: C.EvalConfig,
             json: str | None = typer.Option(None, "--json", help="Also write the numbers to this JSON file.")
             ) -> None:
    """Nearest-neighbour retrieval (the test split queries the train split; hit@k for k in ks) and weighted-kNN
    accuracy."""
    run("retrieve", cfg, json_path=json)


@protocol_command("linear", "Examples: moquad linear --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --fast  |  moquad linear --full --data /data/shards/ucf101 "
                  "--checkpoint C --recipe eval/linear_ucf101.yaml  |  moquad linear --data data/shards --checkpoint C "
                  "--size 32 --frames 8 --num-clips 5")
def linear(cfg: C.EvalConfig, fast: bool = typer.Option(True, "--fast/--full", help="Cached features (fast) or the "
                                                         "CVRL protocol on clips (full).")) -> None:
    """Linear probe on the frozen backbone (its weights and BN statistics are checked unchanged).

    --full is the paper's protocol with --recipe eval/linear_<dataset>.yaml."""
    run("linear", cfg, fast=fast)


@protocol_command("finetune", "Examples: moquad finetune --data /data/shards/ucf101 --checkpoint "
                  "runs/moquad/checkpoints/last.pt --recipe eval/finetune_ucf101.yaml  |  moquad finetune --data "
                  "data/shards --init random --backbone tiny --recipe eval/cpu_demo.yaml --out bound  (the supervised "
                  "bound at the demo's size)",
                  checkpoint_help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt); optional with "
                                  "--init random --backbone NAME.")
def finetune(cfg: C.EvalConfig) -> None:
    """Fine-tune the whole network; multi-clip test, per-class table and confusion matrix.

    The paper's protocol (batch 32, LARS 0.08, 10-clip x 3-crop test): --recipe eval/finetune_<dataset>.yaml.
    --init random trains the same backbone from random init: the supervised bound."""
    run("finetune", cfg)


@app.command(epilog="Example: moquad cam data/UCF-101/Fencing/v_Fencing_g01_c01.avi --data /data/shards/ucf101 "
             "--checkpoint runs/moquad/checkpoints/last.pt --out cam.png")
@_friendly
def cam(
    video: str = typer.Argument(..., help="A video file, or a video_id of --data."),
    checkpoint: str = typer.Option(..., help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt)."),
    data: str = typer.Option("", help="Shard folder (needed when VIDEO is a video_id)."),
    out: str = typer.Option("cam.png", help="PNG image strip to write."),
    frames: int | None = _flag("frames").default,
    size: int | None = _flag("size").default,
    method: str = typer.Option("auto", help="auto (fine-tuned classifier if found, else projection), classifier, "
                               "projection or norm."),
    eval_dir: str | None = typer.Option(None, help="Folder of `moquad finetune` results (to find its classifier)."),
    device: str | None = _flag("device").default,
) -> None:
    """Class-activation maps over a video's frames, saved as an image strip (the paper's Fig. 5)."""
    _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain`")
    if data:
        _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    cfg = settings.resolve(C.EvalConfig(), None, dict(data=data, checkpoint=checkpoint, frames=frames, size=size,
                                               device=device, out=eval_dir))
    typer.echo(f"wrote {run('cam', cfg, video=video, out=out, method=method)}")


@app.command(epilog="Example: moquad export runs/moquad/checkpoints/last.pt --format torchvision --out r3d18.pt, then "
             "model = torchvision.models.video.r3d_18(); model.fc = torch.nn.Identity(); "
             "model.load_state_dict(torch.load('r3d18.pt')); model card: r3d18.json")
@_friendly
def export(
    checkpoint: str = typer.Argument(..., help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt)."),
    fmt: str = typer.Option("torchvision", "--format", help="torchvision (r3d_18, r2plus1d_18, s3d: torchvision "
                            "key names, no head) or safetensors (any backbone)."),
    out: str = typer.Option(..., "--out", "-o", help="File to write; the JSON model card goes beside it (.json)."),
) -> None:
    """Export the pre-trained backbone (torchvision names or safetensors) with a JSON model card."""
    _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)")
    from moquad.export import export as run_export

    weights, card = run_export(checkpoint, fmt, out)
    typer.echo(f"wrote {weights} and its model card {card}")
