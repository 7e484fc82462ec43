"""Supervised fine-tuning of the whole pre-trained backbone (the paper's action-recognition protocol).

Paper (Sec. 4.1): 100 epochs, clips of 16 frames at dilation 2, batch 32, LARS, lr 0.08,
half-period cosine: the defaults of ``cfg.finetune`` (:class:`moquad.config.FinetuneConfig`: epochs,
optimizer, lr used as given (not batch-scaled), batch, weight decay, dropout) with ``cfg.frames`` /
``cfg.dilation``; cosine to 0 without warm-up; LARS as moquad.train.lars (no decay / adaptation on
BN and bias). Training clip: random start, short side ``size*8/7``, random ``size`` crop, random
horizontal flip. The classifier is a fresh linear layer on the pooled backbone feature (the
projection head is dropped), with dropout before it.

Start (``cfg.finetune.init``): ``checkpoint`` loads the pre-trained backbone (``cfg.checkpoint`` naming another
encoder of :mod:`moquad.eval.encoders`, ``hf:NAME`` or ``torchvision:ARCH[:WEIGHTS]``: that whole encoder, trained
end to end under a linear head, clips normalised as its family says); ``random`` trains the
same backbone from random init (seed ``cfg.seed``): the supervised bound of a self-supervised
result (``moquad finetune --init random --backbone NAME``). Its backbone is ``cfg.finetune.backbone``, else
the checkpoint's (read for its settings only), so ``random`` needs no checkpoint when the backbone is named.

Test (SlowFast / the paper): ``cfg.num_clips`` uniformly spaced clips x ``cfg.crops`` (the paper's
recipes: 10 x 3) spatial crops per video; the softmax of all views is averaged per video.

Distributed (torchrun env): DDP, ``cfg.batch_size`` is the GLOBAL batch (split evenly over
ranks, as in pre-training), a DistributedSampler per epoch; the test videos are split over
ranks without padding and every video is predicted exactly once; rank 0 writes.

Outputs in ``OUT`` (named ``finetune_random*`` from random init, so a bound never overwrites a result):
``finetune.json`` + ``finetune.txt`` (top-1/5, per-class accuracy, confusion matrix, protocol,
checkpoint, data), ``finetune_confusion.png`` and
``finetune_model.pt`` (``{"backbone", "classifier", "classes", "config", "source_sha256"}``,
state dicts, loadable with ``weights_only=True``; ``source_sha256`` is the checkpoint the weights
started from, None from random init; ``moquad cam`` uses it when present).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import Progress
from torch import nn

from moquad import dist
from moquad.config import EvalConfig
from moquad.data.augment import normalize
from moquad.data.store import Split
from moquad.errors import MoquadError
from moquad.eval.clips import TrainClips, labelled
from moquad.eval.common import (
    start,
)
from moquad.eval.encoders import Encoder
from moquad.eval.linear import cosine, predict_views
from moquad.eval.report import (
    accuracy_report,
    accuracy_tables,
    finish,
    plot_confusion,
    protocol_table,
    provenance,
)
from moquad.io import atomic_write_bytes
from moquad.models import BACKBONES, build_backbone
from moquad.models.backbones import DEFAULT_INPUT
from moquad.train.optimizers import finetune_optimizer, make_optimizer


class Classifier(nn.Module):
    """Backbone -> dropout -> linear layer over classes."""

    def __init__(self, backbone: nn.Module, feat_dim: int, num_classes: int, dropout: float):
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
    saved_cfg = saved["config"]
    if "backbone" not in saved_cfg:
        raise MoquadError(f"{path} fine-tuned the encoder {saved_cfg.get('encoder', {}).get('spec')}, not a moquad "
                          "backbone; this reads networks fine-tuned from moquad checkpoints")
    backbone, feat_dim = build_backbone(saved_cfg["backbone"], saved_cfg.get("model_input", DEFAULT_INPUT))
    net = Classifier(backbone, feat_dim, len(saved["classes"]), 0.0)  # dropout is off in eval mode anyway
    net.backbone.load_state_dict(saved["backbone"])
    net.fc.load_state_dict(saved["classifier"])
    return net.eval(), saved


def _train(net: nn.Module, cfg: EvalConfig, train: Split, rows: np.ndarray, device: torch.device, rank: int,
           world: int, norm: Callable[[torch.Tensor, Any], torch.Tensor] = normalize, show: bool = True) -> list[float]:
    """Fine-tune ``net`` in place (DDP under torchrun); the mean training loss of every epoch (``show``: the
    progress bar)."""
    ft = cfg.finetune
    opt = make_optimizer(net, ft.optimizer, ft.lr, ft.weight_decay, finetune=True)  # adamw_vit: layer-wise decay
    train_net: nn.Module = net
    if dist.is_dist():
        train_net = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    ds = TrainClips(train, rows, cfg.frames, cfg.dilation, cfg.size, cfg.finetune.flip, cfg.seed)
    per_rank = ft.batch_size // world
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=per_rank, sampler=sampler, num_workers=cfg.workers,
                                         drop_last=len(sampler) > per_rank)  # same step count on every rank
    lrs = cosine(ft.lr, ft.epochs * len(loader))
    losses: list[float] = []
    step = 0
    with Progress(transient=True, disable=not show) as progress:
        task = progress.add_task("fine-tuning", total=len(lrs))
        for epoch in range(ft.epochs):
            ds.epoch = epoch
            sampler.set_epoch(epoch)
            train_net.train()
            total = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device: one sync per epoch
            for clips, labels in loader:
                for g in opt.param_groups:
                    g["lr"] = lrs[step]
                loss = nn.functional.cross_entropy(train_net(norm(clips, device)), labels.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += torch.stack([loss.detach().double() * len(labels), torch.tensor(float(len(labels)), device=device,
                                                                                        dtype=torch.float64)])
                step += 1
                progress.advance(task)
            total = dist.all_reduce(total)
            losses.append(float(total[0] / total[1].clamp_min(1)))
    return losses


def _network(cfg: EvalConfig, encoder: Encoder | None, num_classes: int) -> tuple[Classifier, dict[str, Any], str | None]:
    """The network to fine-tune, the model settings it records, and the sha256 of the weights it starts from."""
    ft = cfg.finetune
    if ft.init == "random":
        name = ft.backbone or (encoder.info.get("backbone") if encoder is not None else None)
        if not name:
            raise MoquadError("fine-tuning from random init needs --backbone NAME (or a --checkpoint to read it from)")
        backbone, feat_dim = build_backbone(name)
        return Classifier(backbone, feat_dim, num_classes, ft.dropout), {"backbone": name}, None
    if encoder is None:
        raise MoquadError("fine-tuning needs --checkpoint RUN/checkpoints/last.pt (or another encoder name), or "
                          "--init random --backbone NAME")
    if ft.backbone and ft.backbone != encoder.info.get("backbone"):
        raise MoquadError(f"finetune.backbone {ft.backbone!r} differs from the encoder's "
                          f"{encoder.info.get('backbone') or encoder.family.description!r}; drop --backbone (the "
                          "supervised bound: --init random --backbone NAME without the encoder)")
    facts = {"backbone": encoder.info.get("backbone"), "model_input": encoder.info.get("model_input", DEFAULT_INPUT)}
    settings = encoder.config or {"encoder": encoder.record(), **({} if facts["backbone"] is None else facts)}
    net = Classifier(encoder.trainable(), encoder.out_dim, num_classes, ft.dropout)
    return net, dict(settings), encoder.sha256()


def _optimizer(cfg: EvalConfig, encoder: Encoder | None) -> tuple[EvalConfig, str]:
    """``cfg`` with fine-tuning's optimizer settled (unset: the backbone row's, or the encoder row's, and that
    optimizer's fine-tuning setting), and the start-up line that says so."""
    ft = cfg.finetune
    name = ft.backbone if ft.init == "random" and ft.backbone else None
    if name is None and encoder is not None:
        default, whose = encoder.family.optimizer(encoder), (f"the {encoder.info['backbone']} backbone" if
                                                             encoder.info.get("backbone") else f"the {encoder.label} encoder")
    else:
        name = name or "r3d_18"
        default, whose = BACKBONES[name].optimizer, f"the {name} backbone"
    settled, line = finetune_optimizer(ft, default, whose)
    return dataclasses.replace(cfg, finetune=settled), line


def _save_model(net: Classifier, classes: list[str], settings: dict[str, Any], source: str | None, path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"backbone": net.backbone.state_dict(), "classifier": net.fc.state_dict(), "classes": classes,
                "config": settings, "source_sha256": source}, buf)
    atomic_write_bytes(path, buf.getvalue())


def _protocol(cfg: EvalConfig, world: int) -> dict[str, Any]:
    ft = cfg.finetune
    return {
        "init": "random (no pre-training: the supervised bound)" if ft.init == "random" else f"the encoder "
        f"{cfg.checkpoint}, end to end, a linear head on its pooled feature",
        "train_clip": f"{cfg.frames} frames, dilation {cfg.dilation}, random start, short side size*8/7, "
                      f"random crop{' + h-flip' if ft.flip else ', no flip'}", "epochs": ft.epochs, "batch_size": ft.batch_size,
        "ranks": world, "optimizer": ft.optimizer, "lr": ft.lr, "schedule": "half-period cosine, no warm-up",
        "weight_decay": ft.weight_decay, "dropout": ft.dropout,
        "test": f"{cfg.num_clips} clips x {cfg.crops} crops, softmax averaged per video",
    }


def finetune(cfg: EvalConfig, *, json_path: str | Path | None = None, quiet: bool = False,
             overwrite: bool = False, encoder: Encoder | None = None) -> dict[str, Any]:
    """Fine-tune (from the encoder, or from random init) on ``cfg.train_split``, test on ``cfg.test_split``;
    write results to the evaluation folder (``cfg.out``, else ``RUN/eval`` beside the checkpoint), and a copy of
    the JSON to ``json_path`` when given. A result already there (``moquad finetune``'s, say) is an error before
    any training unless ``overwrite``. ``quiet``: print no table. ``encoder``: the one the command resolved
    (default: the one ``cfg.checkpoint`` names). The optimizer line is printed before training."""
    name = "finetune" if cfg.finetune.init == "checkpoint" else "finetune_random"  # a bound never overwrites
    s = start(cfg, encoder, f"{name}.json", overwrite, "fine-tuning", need=False)
    encoder, train, test, device, rank, world = s.encoder, s.train, s.test, s.device, s.rank, s.world
    cfg, line = _optimizer(s.cfg, encoder)
    proto, classes = _protocol(cfg, world), s.classes
    if cfg.finetune.batch_size % world:
        raise MoquadError(f"finetune.batch_size {cfg.finetune.batch_size} is the global batch; "
                          f"make it a multiple of {world} ranks")
    if rank == 0 and not quiet:  # the command's start-up line (a quiet Python call prints nothing)
        print(line, flush=True)
    torch.manual_seed(cfg.seed)
    train_rows, test_rows = labelled(train), labelled(test)
    net, settings, source = _network(cfg, encoder, max(len(classes), int(train.label.max()) + 1))
    net = net.to(device)
    norm = encoder.normalize if encoder is not None and cfg.finetune.init == "checkpoint" else normalize
    show = rank == 0 and not quiet
    losses = _train(net, cfg, train, train_rows, device, rank, world, norm, show)
    # test: rank r takes videos r, r+W, ... (no padding), probabilities gathered and put back in order
    mine = dist.my_rows(len(test_rows))
    framing = encoder.framing if encoder is not None and cfg.finetune.init == "checkpoint" else None
    probs = dist.gather_rows(mine, predict_views(net, cfg, test, test_rows[mine], device, show=show, norm=norm,
                                                 framing=framing), len(test_rows))
    labels = test.label[test_rows]
    report = accuracy_report(probs, labels, classes)
    out = s.path.parent
    model_path, png = out / f"{name}_model.pt", out / f"{name}_confusion.png"
    if rank == 0:
        _save_model(net, classes, settings, source, model_path)
        plot_confusion(np.array(report["confusion"]), classes, png, f"fine-tuned, top-1 {100 * report['top1']:.1f}%")
    result = provenance(cfg, train, test, encoder)
    result.update(task="finetune", protocol=proto, **report)
    result["train_loss_per_epoch"] = losses
    result["predictions"] = [{"video_id": str(test.video_id[i]), "label": int(y), "pred": int(p.argmax())}
                             for i, y, p in zip(test_rows, labels, probs)]
    result["confusion_png"], result["model"] = str(png), str(model_path)
    finish(result, cfg, encoder, s.path, lambda r: [*accuracy_tables("fine-tuning", report),
                                                     protocol_table("protocol", r)], json_path, quiet)
    dist.barrier()  # files written by rank 0 exist when any rank returns
    return result

