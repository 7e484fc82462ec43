"""Supervised fine-tuning of the whole pre-trained backbone (the paper's action-recognition protocol).

Paper (Sec. 4.1): 100 epochs, clips of 16 frames at dilation 2, batch 32, LARS, lr 0.08,
half-period cosine. Here: ``cfg.epochs``, ``cfg.frames`` / ``cfg.dilation``, ``cfg.batch_size``,
``cfg.optimizer`` (moquad.train.lars: no decay / adaptation on BN and bias), ``cfg.lr``
used as given (not batch-scaled), cosine to 0 without warm-up. Training clip: random start,
short side ``size*8/7``, random ``size`` crop, random horizontal flip. The classifier is a
fresh linear layer on the pooled backbone feature (the projection head is dropped), with
dropout ``dropout`` before it.

Test (SlowFast / the paper): ``cfg.num_clips`` uniformly spaced clips x ``test_crops``
(default ``cfg.crops``; the paper uses 10 x 3) spatial crops per video; the softmax of all
views is averaged per video.

Distributed (torchrun env): DDP, ``cfg.batch_size`` is the GLOBAL batch (split evenly over
ranks, as in pre-training), a DistributedSampler per epoch; the test videos are split over
ranks without padding and every video is predicted exactly once; rank 0 writes.

Outputs in ``OUT``: ``finetune.json`` + ``finetune.txt`` (top-1/5, per-class accuracy,
confusion matrix, protocol, checkpoint, data), ``finetune_confusion.png`` and
``finetune_model.pt`` (``{"backbone", "classifier", "classes", "config", "source_sha256"}``,
state dicts, loadable with ``weights_only=True``; ``moquad cam`` uses it when present).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch
from rich.progress import Progress
from torch import nn

from moquad.config import EvalConfig
from moquad.eval.clips import reading_table
from moquad.eval.common import (
    accuracy_report,
    accuracy_tables,
    check_inputs,
    dataset_classes,
    dist_env,
    load_checkpoint,
    lr_per_step,
    make_optimizer,
    normalize,
    out_dir,
    protocol_table,
    provenance,
    read_split,
    resolve_device,
    sha256_file,
    write_result,
)
from moquad.eval.linear import TrainClips, predict_views


class Classifier(nn.Module):
    """Backbone -> dropout -> linear layer over classes."""

    def __init__(self, backbone: nn.Module, feat_dim: int, num_classes: int, dropout: float = 0.5):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(feat_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.backbone(x)))


def load_classifier(path: str | Path) -> tuple[Classifier, dict[str, Any]]:
    """Rebuild the fine-tuned network saved by :func:`finetune`."""
    from moquad.models import build_backbone

    saved = torch.load(path, map_location="cpu", weights_only=True)
    backbone, feat_dim = build_backbone(saved["config"]["backbone"])
    net = Classifier(backbone, feat_dim, len(saved["classes"]))
    net.backbone.load_state_dict(saved["backbone"])
    net.fc.load_state_dict(saved["classifier"])
    return net.eval(), saved


def plot_confusion(conf: np.ndarray, classes: list[str], path: Path, title: str) -> Path:
    """Row-normalised confusion matrix as a PNG (labels shown up to 60 classes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = np.asarray(conf, dtype=np.float64)
    norm = conf / np.maximum(conf.sum(1, keepdims=True), 1)
    n = len(conf)
    side = min(20.0, max(4.0, 0.25 * n + 2))
    fig, ax = plt.subplots(figsize=(side, side))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 60:
        names = (classes + [str(i) for i in range(len(classes), n)])[:n]
        ax.set_xticks(range(n), names, rotation=90, fontsize=7)
        ax.set_yticks(range(n), names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def finetune(cfg: EvalConfig, *, test_crops: int | None = None, weight_decay: float = 1e-4, dropout: float = 0.5,
             json_path: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune the checkpoint's backbone on the train split, test on the test split; write results."""
    check_inputs(cfg)
    test_crops = cfg.crops if test_crops is None else test_crops
    if test_crops not in (1, 3):
        raise ValueError(f"test_crops must be 1 or 3, got {test_crops}")
    rank, world = dist_env()
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} is the global batch; make it a multiple of {world} ranks")
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    train_t, test_t = read_split(cfg.data, "train"), read_split(cfg.data, "test")
    classes = dataset_classes(cfg.data, train_t)
    train_rows, test_rows = reading_table(train_t, labelled=True), reading_table(test_t, labelled=True)
    if not train_rows.num_rows or not test_rows.num_rows:
        raise ValueError("fine-tuning needs labelled videos in both the train and the test split")
    model, ckpt = load_checkpoint(cfg.checkpoint)
    n_cls = max(len(classes), pc.max(train_rows.column("label")).as_py() + 1)
    net = Classifier(model.backbone, model.feat_dim, n_cls, dropout).to(device)
    opt = make_optimizer(net, cfg.optimizer, cfg.lr, weight_decay)
    train_net: nn.Module = net
    if world > 1:
        train_net = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)

    ds = TrainClips(cfg.data, train_rows, cfg.frames, cfg.dilation, cfg.size, cfg.seed)
    per_rank = cfg.batch_size // world
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=per_rank, sampler=sampler, num_workers=cfg.workers,
                                         drop_last=len(sampler) > per_rank)  # same step count on every rank
    lrs = lr_per_step(cfg.lr, cfg.epochs * len(loader))
    losses: list[float] = []
    step = 0
    with Progress(transient=True, disable=rank != 0) as progress:
        task = progress.add_task("fine-tuning", total=len(lrs))
        for epoch in range(cfg.epochs):
            ds.epoch = epoch
            sampler.set_epoch(epoch)
            train_net.train()
            total = torch.zeros(2, dtype=torch.float64, device=device)
            for clips, labels in loader:
                for g in opt.param_groups:
                    g["lr"] = lrs[step]
                loss = nn.functional.cross_entropy(train_net(normalize(clips, device)), labels.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += torch.tensor([loss.item() * len(labels), len(labels)], dtype=torch.float64, device=device)
                step += 1
                progress.advance(task)
            if world > 1:
                torch.distributed.all_reduce(total)
            losses.append(float(total[0] / total[1].clamp_min(1)))

    # test: rank r takes videos r, r+W, ... (no padding), probabilities gathered and put back in order
    mine = list(range(rank, test_rows.num_rows, world))
    test_cfg = dataclasses.replace(cfg, crops=test_crops)
    probs = predict_views(net, test_cfg, test_rows.take(mine), device, show=rank == 0)
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, (mine, probs))
        mine = [i for g in gathered for i in g[0]]
        probs = np.concatenate([g[1] for g in gathered if len(g[0])])
    if sorted(mine) != list(range(test_rows.num_rows)):
        raise RuntimeError("every test video must be predicted exactly once")
    ordered = np.empty_like(probs)
    ordered[np.asarray(mine)] = probs
    probs = ordered
    test_ids = test_rows.column("video_id").to_pylist()
    test_labels = test_rows.column("label").to_numpy().astype(np.int64)
    report = accuracy_report(probs, test_labels, classes)
    out = out_dir(cfg)
    model_path, png = out / "finetune_model.pt", out / "finetune_confusion.png"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"backbone": net.backbone.state_dict(), "classifier": net.fc.state_dict(), "classes": classes,
                    "config": dict(ckpt["config"]), "source_sha256": sha256_file(cfg.checkpoint)}, model_path)
        plot_confusion(np.array(report["confusion"]), classes, png, f"fine-tuned, top-1 {100 * report['top1']:.1f}%")
    result = provenance(cfg, {"train": train_t, "test": test_t})
    result.update(task="finetune", **report)
    result["protocol"] = {
        "train_clip": f"{cfg.frames} frames, dilation {cfg.dilation}, random start, short side size*8/7, "
                      "random crop + h-flip", "epochs": cfg.epochs, "batch_size": cfg.batch_size,
        "ranks": world, "optimizer": cfg.optimizer, "lr": cfg.lr, "schedule": "half-period cosine, no warm-up",
        "weight_decay": weight_decay, "dropout": dropout,
        "test": f"{cfg.num_clips} clips x {test_crops} crops, softmax averaged per video",
    }
    result["train_loss_per_epoch"] = losses
    result["predictions"] = [{"video_id": v, "label": int(y), "pred": int(p.argmax())}
                             for v, y, p in zip(test_ids, test_labels, probs)]
    result["confusion_png"], result["model"] = str(png), str(model_path)
    json_path = Path(json_path) if json_path else out / "finetune.json"
    write_result(result, json_path, [*accuracy_tables("fine-tuning", report), protocol_table("protocol", result)])
    if world > 1:
        torch.distributed.barrier()  # files written by rank 0 exist when any rank returns
    result["json"] = str(json_path)
    return result
