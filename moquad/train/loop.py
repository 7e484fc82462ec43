"""``moquad pretrain``: Algorithm 1 of the paper on one process or many (torchrun).

Epochs ``e < warmup_ratio * epochs`` train the appearance task (Eq. 3, loader mode
``appearance``), the rest MoQuad (Eq. 1 / Eq. 4, mode ``moquad``); ``method=simclr`` trains
NT-Xent on two clips throughout. LARS with the SimCLR schedule precomputed per step.
Checkpoints go to ``RUN/checkpoints/last.pt`` every ``ckpt_every`` steps and at each epoch end;
``resume`` continues from it with the same schedule and data order (the loader is deterministic
per (seed, epoch); the batches of the interrupted epoch already trained on are skipped).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import moquad
from moquad import dist
from moquad.config import PretrainConfig, to_dict
from moquad.config import save as save_config
from moquad.models import VideoModel, build_model
from moquad.train import checkpoint
from moquad.train.lars import LARS, param_groups
from moquad.train.log import RunLogger
from moquad.train.losses import appearance_loss, moquad_loss, nt_xent_loss
from moquad.train.schedule import lr_schedule, stage_per_epoch

LoaderFn = Callable[..., Iterable[dict[str, Any]]]
# checkpoint fields that must match for a resumed run to continue the same schedule and data order
_RESUME_KEYS = (
    "method",
    "backbone",
    "proj_dim",
    "proj_hidden",
    "epochs",
    "batch_size",
    "lr",
    "lr_warmup_epochs",
    "warmup_ratio",
    "steps_per_epoch",
    "seed",
    "optimizer",
    "split",
    "temperature",
    "hard_beta",
    "hard_alpha",
    "weight_decay",
)


def build_optimizer(model: nn.Module, cfg: PretrainConfig) -> torch.optim.Optimizer:
    """LARS (default), SGD or AdamW; BN and bias parameters get no weight decay (nor LARS adaptation)."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "lars":
        return LARS(groups, lr=0.0, momentum=0.9, weight_decay=cfg.weight_decay, eeta=1e-3)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=0.0, momentum=0.9, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=0.0, weight_decay=cfg.weight_decay)
    raise ValueError(f"optimizer must be lars, sgd or adamw, got {cfg.optimizer!r}")


def forward_loss(
    model: nn.Module,
    views: torch.Tensor,
    view_names: Sequence[str],
    mode: str,
    *,
    tau: float = 0.1,
    hard_beta: float = 0.0,
    hard_alpha: float = 1.5,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one batch: ``views`` (B, V, 3, T, H, W) normalised float on the model's device.

    All B*V clips go through the network in one forward (as SimCLR concatenates its views);
    projections of the whole global batch are gathered with gradients under DDP.
    """
    b, v = views.shape[:2]
    x = views.flatten(0, 1)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if x.device.type == "cuda" else nullcontext()
    with amp:
        z = model(x)
    z = z.float().reshape(b, v, -1)
    z_global = dist.gather(z) if dist.is_dist() else None
    offset = dist.get_rank() * b
    if mode == "moquad":
        return moquad_loss(
            z,
            view_names,
            z_global=z_global,
            offset=offset,
            tau=tau,
            hard_beta=hard_beta,
            hard_alpha=hard_alpha,
        )
    if mode == "appearance":
        return appearance_loss(z, z_global=z_global, offset=offset, tau=tau)
    if mode == "simclr":
        return nt_xent_loss(z, z_global=z_global, offset=offset, tau=tau)
    raise ValueError(f"unknown training mode {mode!r}")


def _default_loader_fn(pin_memory: bool) -> LoaderFn:
    from moquad.data.pipeline import make_loader

    return functools.partial(make_loader, pin_memory=pin_memory)


def _default_batches_fn() -> Callable[[str, str, int], int]:
    from moquad.data.pipeline import batches_per_epoch

    return batches_per_epoch


def _to_device(batch: dict[str, Any], device: torch.device, size: int) -> torch.Tensor:
    """Normalised float views on ``device``; ``augment_on_device`` batches are augmented there too."""
    from moquad.data.augment import device_augment

    return device_augment(batch, device, size)


def _check_resume(saved: dict[str, Any], cfg: PretrainConfig, path: Path) -> None:
    now = to_dict(cfg)
    diff = [k for k in _RESUME_KEYS if saved.get(k) != now.get(k)]
    # loader settings shape the data of every step; the number of worker processes may change
    old_loader, new_loader = dict(saved.get("loader") or {}), dict(now["loader"])
    diff += [f"loader.{k}" for k in new_loader if k != "workers" and old_loader.get(k) != new_loader[k]]
    if diff:

        def get(d: dict, key: str):
            return d.get("loader", {}).get(key[7:]) if key.startswith("loader.") else d.get(key)

        pairs = ", ".join(f"{k}: {get(saved, k)!r} -> {get(now, k)!r}" for k in diff)
        raise ValueError(
            f"cannot resume {path}: settings changed ({pairs}); use the original settings or a new --out"
        )


def _progress(enabled: bool, total: int, completed: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(
        TextColumn("pretrain"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not enabled,
    )
    task = prog.add_task("pretrain", total=total, completed=completed, info="")
    return prog, task


def pretrain(
    cfg: PretrainConfig,
    *,
    loader_fn: LoaderFn | None = None,
    batches_fn: Callable[[str, str, int], int] | None = None,
    keep_every_epochs: int = 0,
    tensorboard: bool = True,
    progress: bool = True,
) -> Path:
    """Pre-train and return the final checkpoint (``RUN/checkpoints/last.pt``).

    ``loader_fn`` / ``batches_fn`` default to ``moquad.data.pipeline.make_loader`` /
    ``batches_per_epoch`` (tests inject fakes). ``keep_every_epochs > 0`` also keeps
    ``step-N.pt`` at every that many epochs.
    """
    info = dist.init(cfg.device)
    try:
        loader_fn = loader_fn or _default_loader_fn(info.device.type == "cuda")
        return _pretrain(cfg, info, loader_fn, batches_fn, keep_every_epochs, tensorboard, progress)
    finally:
        dist.cleanup()


def _pretrain(cfg, info, loader_fn, batches_fn, keep_every_epochs, tensorboard, progress) -> Path:
    world, rank, device = info.world_size, info.rank, info.device
    if cfg.batch_size <= 0 or cfg.batch_size % world:
        raise ValueError(
            f"batch_size {cfg.batch_size} (global) must be a positive multiple of the {world} processes"
        )
    if cfg.epochs <= 0 or cfg.ckpt_every <= 0 or cfg.log_every <= 0:
        raise ValueError(
            f"epochs, ckpt_every and log_every must be positive (got {cfg.epochs}, {cfg.ckpt_every}, "
            f"{cfg.log_every})"
        )
    per_rank = cfg.batch_size // world
    spe = cfg.steps_per_epoch or (batches_fn or _default_batches_fn())(cfg.data, cfg.split, cfg.batch_size)
    if spe <= 0:
        raise ValueError(
            f"{cfg.data} split {cfg.split!r} has too few videos for a global batch of {cfg.batch_size}"
        )
    total = cfg.epochs * spe
    lrs = lr_schedule(cfg.lr, cfg.batch_size, total, round(cfg.lr_warmup_epochs * spe))
    modes = stage_per_epoch(cfg.epochs, cfg.warmup_ratio, cfg.method)

    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    run = Path(cfg.out)
    ckpt_path = run / "checkpoints" / "last.pt"
    torch.manual_seed(cfg.seed)
    model: nn.Module = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden).to(device)
    optimizer = build_optimizer(model, cfg)
    start = 0
    if ckpt_path.is_file():
        if not cfg.resume:
            raise ValueError(
                f"{run} already holds a checkpoint; pass --resume to continue it or choose a new --out"
            )
        ckpt = checkpoint.load(ckpt_path)
        _check_resume(ckpt["config"], cfg, ckpt_path)
        if ckpt.get("steps_per_epoch", spe) != spe:
            raise ValueError(
                f"cannot resume {ckpt_path}: it was trained with {ckpt['steps_per_epoch']} steps per "
                f"epoch, the data now gives {spe}; pass --steps-per-epoch {ckpt['steps_per_epoch']}"
            )
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start = int(ckpt["step"])
    core: VideoModel = model  # type: ignore[assignment]
    if cfg.sync_bn and (world == 1 or device.type != "cuda") and rank == 0:
        warnings.warn(
            "sync_bn needs several GPU processes (NCCL); training with per-process BatchNorm", stacklevel=2
        )
    if world > 1:
        if cfg.sync_bn and device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            core = model  # type: ignore[assignment]
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

    main = rank == 0
    if main:
        save_config(cfg, run / "config.yaml")
    logger = RunLogger(run, start_step=start, tensorboard=tensorboard) if main else None

    def save(step: int, epoch: int, path: Path = ckpt_path) -> None:
        if main:
            checkpoint.save(
                {
                    "model": core.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "steps_per_epoch": spe,
                    "config": to_dict(cfg),
                    "seeds": {"seed": cfg.seed, "loader_seed": cfg.loader.seed},
                    "moquad_version": moquad.__version__,
                    "git": checkpoint.git_revision(),
                },
                path,
            )

    try:
        prog, task = _progress(main and progress, total, start)
        model.train()
        with prog:
            for epoch in range(start // spe, cfg.epochs):
                loader_cfg = dataclasses.replace(cfg.loader, mode=modes[epoch])
                loader = loader_fn(
                    cfg.data,
                    loader_cfg,
                    split=cfg.split,
                    batch_size=per_rank,
                    epoch=epoch,
                    rank=rank,
                    world_size=world,
                    num_batches=spe,
                )
                batches = iter(loader)
                skip = start - epoch * spe if epoch == start // spe else 0
                t_prev = time.perf_counter()
                for i in range(spe):
                    try:
                        batch = next(batches)
                    except StopIteration:
                        raise ValueError(
                            f"the loader gave only {i} of {spe} batches in epoch {epoch}"
                        ) from None
                    if i < skip:
                        t_prev = time.perf_counter()
                        continue
                    t_data = time.perf_counter()
                    step = epoch * spe + i
                    lr = float(lrs[step])
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                    views = _to_device(batch, device, loader_cfg.size)
                    loss, stats = forward_loss(
                        model,
                        views,
                        batch["view_names"],
                        modes[epoch],
                        tau=cfg.temperature,
                        hard_beta=cfg.hard_beta,
                        hard_alpha=cfg.hard_alpha,
                    )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    vals = dist.all_reduce_mean(
                        torch.tensor(
                            [loss.item(), stats["rank_pos"], stats["rank_intra_neg"]],
                            dtype=torch.float64,
                            device=device,
                        )
                    )
                    t_end = time.perf_counter()
                    done = step + 1
                    if main and (done % cfg.log_every == 0 or done == total):
                        dt = t_end - t_prev
                        rec = {
                            "epoch": epoch,
                            "mode": modes[epoch],
                            "loss": float(vals[0]),
                            "lr": lr,
                            "clips_per_s": cfg.batch_size * views.shape[1] / dt,
                            "data_wait": (t_data - t_prev) / dt,
                            "rank_ad_pos": float(vals[1]),
                            "rank_intra_neg": float(vals[2]),
                            "time": time.time(),
                        }
                        logger.log(done, rec)
                        prog.update(
                            task, completed=done, info=f"{modes[epoch]} loss {rec['loss']:.4f} lr {lr:.3g}"
                        )
                    end_of_epoch = i == spe - 1
                    if done % cfg.ckpt_every == 0 or end_of_epoch:
                        save(done, epoch + 1 if end_of_epoch else epoch)
                    if end_of_epoch and keep_every_epochs and (epoch + 1) % keep_every_epochs == 0:
                        save(done, epoch + 1, run / "checkpoints" / f"step-{done}.pt")
                    t_prev = time.perf_counter()
    finally:
        if logger is not None:
            logger.close()
    dist.barrier()
    return ckpt_path
