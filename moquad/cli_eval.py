"""The evaluation commands of the ``moquad`` CLI (stage 3): extract, retrieve, linear, finetune, cam, export.

Registered on the main app by ``moquad.cli``; same conventions: parse options, build a config, call ONE function.
"""

from __future__ import annotations

import typer

from moquad import config as C
from moquad.cli_common import (
    _CKPT,
    _DATA,
    _PRINT,
    _RECIPE,
    _SET,
    _eval_cfg,
    _friendly,
    _need_dir,
    _need_file,
    _printed,
)

app = typer.Typer()


@app.command(epilog="Examples: moquad extract --data /data/shards/ucf101 --checkpoint runs/moquad/checkpoints/last.pt --split test  |  "
             "moquad extract --data D --checkpoint C --crops 3 --set workers=8")
@_friendly
def extract(
    data: str = _DATA,
    checkpoint: str = _CKPT,
    split: str = typer.Option("test", help="Split to extract."),
    recipe: str | None = _RECIPE,
    num_clips: int | None = typer.Option(None, help="Uniformly spaced clips per video (10)."),
    frames: int | None = typer.Option(None, help="Frames per clip (16)."),
    dilation: int | None = typer.Option(None, help="Frame step inside a clip (2)."),
    size: int | None = typer.Option(None, help="Crop size (224)."),
    crops: int | None = typer.Option(None, help="1 (centre, default) or 3 crops."),
    batch_size: int | None = typer.Option(None, help="Clips per forward pass."),
    out: str | None = typer.Option(None, help="Folder for the Lance feature cache."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
    force: bool = typer.Option(False, "--force", help="Re-extract even when a matching cache exists."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Extract per-video backbone features (multi-clip average) into a Lance dataset."""
    cfg = _eval_cfg(data, checkpoint, recipe, sets, num_clips=num_clips, frames=frames, dilation=dilation, size=size,
                    crops=crops, batch_size=batch_size, out=out, device=device)
    if _printed(cfg, print_config):
        return
    from moquad.eval.features import extract as run_extract

    typer.echo(f"features: {run_extract(cfg, split, force=force)}")


@app.command(epilog="Examples: moquad retrieve --data /data/shards/ucf101 --checkpoint runs/moquad/checkpoints/last.pt --json retrieval.json --knn-k 20 --knn-t 0.07  |  "
             "moquad retrieve --data data/shards --checkpoint CKPT --recipe eval/cpu_demo.yaml --set ks=1,5")
@_friendly
def retrieve(
    data: str = _DATA,
    checkpoint: str = _CKPT,
    recipe: str | None = _RECIPE,
    json: str | None = typer.Option(None, "--json", help="Also write the numbers to this JSON file."),
    center: bool | None = typer.Option(None, "--center/--no-center", help="Subtract the split mean, re-normalise."),
    index: str | None = typer.Option(None, help="exact (default) or lance (vector index, recall reported)."),
    knn_k: int | None = typer.Option(None, help="Weighted kNN (DINO): neighbours that vote (20)."),
    knn_t: float | None = typer.Option(None, help="Weighted kNN (DINO): vote weight exp(cosine / T) (0.07)."),
    num_clips: int | None = typer.Option(None, help="Clips per video (10)."),
    frames: int | None = typer.Option(None, help="Frames per clip (16)."),
    dilation: int | None = typer.Option(None, help="Frame step inside a clip (2)."),
    size: int | None = typer.Option(None, help="Crop size (224)."),
    out: str | None = typer.Option(None, help="Folder for features and results."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Nearest-neighbour retrieval (test queries the train split; hit@1/5/10/20/50) and weighted-kNN accuracy."""
    cfg = _eval_cfg(data, checkpoint, recipe, sets, center=center, index=index, knn_k=knn_k, knn_t=knn_t,
                    num_clips=num_clips, frames=frames, dilation=dilation, size=size, out=out, device=device)
    if _printed(cfg, print_config):
        return
    from moquad.eval.retrieve import retrieve as run_retrieve

    run_retrieve(cfg, json_path=json)


@app.command(epilog="Examples: moquad linear --data /data/shards/ucf101 --checkpoint runs/moquad/checkpoints/last.pt --fast  |  "
             "moquad linear --full --data /data/shards/ucf101 --checkpoint C --recipe eval/linear_ucf101.yaml  |  "
             "moquad linear --data data/shards --checkpoint C --size 32 --frames 8 --num-clips 5")
@_friendly
def linear(
    data: str = _DATA,
    checkpoint: str = _CKPT,
    recipe: str | None = _RECIPE,
    fast: bool = typer.Option(True, "--fast/--full", help="Cached features (fast) or CVRL protocol on clips (full)."),
    frames: int | None = typer.Option(None, help="Frames per clip (16; the CVRL recipes eval/linear_*.yaml: 32)."),
    dilation: int | None = typer.Option(None, help="Frame step inside a clip (2)."),
    size: int | None = typer.Option(None, help="Crop size (224); use the pre-training size."),
    num_clips: int | None = typer.Option(None, help="Clips per video (10)."),
    crops: int | None = typer.Option(None, help="Test crops: 1 (default) or 3 (the paper's 10-clip x 3-crop test)."),
    epochs: int | None = typer.Option(None, help="Training epochs (100)."),
    lr: float | None = typer.Option(None, help="Learning rate."),
    batch_size: int | None = typer.Option(None, help="Batch size."),
    out: str | None = typer.Option(None, help="Folder for results."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Linear probe on the frozen backbone (its weights and BN statistics are checked unchanged).

    --full is the paper's protocol with --recipe eval/linear_<dataset>.yaml."""
    cfg = _eval_cfg(data, checkpoint, recipe, sets, frames=frames, dilation=dilation, size=size, num_clips=num_clips,
                    crops=crops, epochs=epochs, lr=lr, batch_size=batch_size, out=out, device=device)
    if _printed(cfg, print_config):
        return
    from moquad.eval.linear import linear as run_linear

    run_linear(cfg, fast=fast, frames=cfg.frames, dilation=cfg.dilation)


@app.command(epilog="Examples: moquad finetune --data /data/shards/ucf101 --checkpoint runs/moquad/checkpoints/last.pt --recipe eval/finetune_ucf101.yaml  |  "
             "moquad finetune --data data/shards --checkpoint C --size 32 --frames 8 --num-clips 5 --set optimizer=sgd")
@_friendly
def finetune(
    data: str = _DATA,
    checkpoint: str = _CKPT,
    recipe: str | None = _RECIPE,
    epochs: int | None = typer.Option(None, help="Training epochs (paper: 100)."),
    lr: float | None = typer.Option(None, help="Learning rate (paper: LARS 0.08)."),
    batch_size: int | None = typer.Option(None, help="Batch size (paper: 32)."),
    frames: int | None = typer.Option(None, help="Frames per clip (16)."),
    dilation: int | None = typer.Option(None, help="Frame step (2)."),
    size: int | None = typer.Option(None, help="Crop size (224); use the pre-training size."),
    num_clips: int | None = typer.Option(None, help="Test clips per video (10)."),
    crops: int | None = typer.Option(None, help="Test crops: 1 (default) or 3 (the paper's test, set by eval/finetune_*.yaml)."),
    out: str | None = typer.Option(None, help="Folder for results."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
    sets: list[str] | None = _SET,
    print_config: bool = _PRINT,
) -> None:
    """Fine-tune the whole network; multi-clip test, per-class table and confusion matrix.

    The paper's protocol (batch 32, 10-clip x 3-crop test): --recipe eval/finetune_<dataset>.yaml."""
    cfg = _eval_cfg(data, checkpoint, recipe, sets, epochs=epochs, lr=lr, batch_size=batch_size, frames=frames,
                    dilation=dilation, size=size, num_clips=num_clips, crops=crops, out=out, device=device)
    if _printed(cfg, print_config):
        return
    from moquad.eval.finetune import finetune as run_finetune

    run_finetune(cfg)


@app.command(epilog="Example: moquad cam data/UCF-101/Fencing/v_Fencing_g01_c01.avi --data /data/shards/ucf101 --checkpoint runs/moquad/checkpoints/last.pt --out cam.png")
@_friendly
def cam(
    video: str = typer.Argument(..., help="A video file, or a video_id of --data."),
    checkpoint: str = _CKPT,
    data: str = typer.Option("", help="Shard folder (needed when VIDEO is a video_id)."),
    out: str = typer.Option("cam.png", help="PNG image strip to write."),
    frames: int | None = typer.Option(None, help="Frames shown (16)."),
    size: int | None = typer.Option(None, help="Input size (224); use the pre-training size."),
    method: str = typer.Option("auto", help="auto (fine-tuned classifier if found, else projection), classifier, projection or norm."),
    eval_dir: str | None = typer.Option(None, help="Folder of `moquad finetune` results (to find its classifier)."),
    device: str | None = typer.Option(None, help="auto, cpu or cuda."),
) -> None:
    """Class-activation maps over a video's frames, saved as an image strip (the paper's Fig. 5)."""
    _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain`")
    if data:
        _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    cfg = C.resolve(C.EvalConfig(), None, dict(data=data, checkpoint=checkpoint, frames=frames, size=size, device=device,
                                               out=eval_dir))
    from moquad.eval.cam import cam as run_cam

    typer.echo(f"wrote {run_cam(video, cfg, out, method=method)}")


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
