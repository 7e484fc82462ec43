"""``moquad pretrain``: Algorithm 1 of the paper on one process or many (torchrun).

Methods (``cfg.method``): the table :data:`moquad.train.methods.METHODS`.

Setup, then one function per epoch, in the style of DINO's ``main_dino.py``; the step is nanoGPT's:
host syncs (``.item()``, the cross-rank mean, the NaN check) happen only at log steps and before a
checkpoint. Checkpoints go to ``RUN/checkpoints/last.pt`` every ``ckpt_every`` steps and at each epoch
end; ``resume`` continues from it with the same schedule and data order: the loader COMPUTES the
batch at the resumed step (exact epochs), nothing is decoded and skipped. The loader is built once per run
(:class:`~moquad.data.pipeline.RunLoader`: manifest read and shards checked once, workers kept across epochs),
and its plan depends on the GLOBAL batch only, so ``--resume`` on another number of ranks or workers continues
with the same global batches; a changed global batch is refused (:func:`checkpoint.check_global_batch`). SIGTERM / SIGUSR1 stop every
rank after the same step with a checkpoint and exit code 75 (:mod:`moquad.train.preempt`); a second
``pretrain`` into the same ``--out`` is refused (:mod:`moquad.lock`).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from moquad import dist, lock
from moquad.config import PretrainConfig
from moquad.config import save as save_config
from moquad.data.pipeline import make_loader
from moquad.data.workers import end_workers
from moquad.errors import MoquadError, setting
from moquad.io import atomic_write_text, remove_stale_temps
from moquad.models import build_model
from moquad.train import checkpoint, preempt
from moquad.train.log import RunLogger
from moquad.train.losses import Projections
from moquad.train.methods import METHODS, Method, Stage, resolve
from moquad.train.momentum import MomentumEncoder, Online, gather_keys, key_order, set_splits
from moquad.train.momentum import build as build_momentum
from moquad.train.momentum import describe as describe_momentum
from moquad.train.optimizers import make_optimizer, pretrain_optimizer
from moquad.train.schedule import lr_schedule


def _project(model: nn.Module, views: torch.Tensor) -> torch.Tensor:
    """Projections (B, V, D) fp32 of ``views`` (B, V, 3, T, H, W): all B*V clips in one forward (as SimCLR
    concatenates its views)."""
    b, v = views.shape[:2]
    x = views.flatten(0, 1)
    if x.device.type == "cuda":  # measured on an H100: R3D-18 steps 1.5-1.6x faster channels-last (README)
        x = x.contiguous(memory_format=torch.channels_last_3d)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if x.device.type == "cuda" else nullcontext()
    with amp:
        z = model(x)
    return z.float().reshape(b, v, -1)


def forward_loss(
    model: nn.Module,
    views: torch.Tensor,
    roles: Sequence[str],
    loss: str | Callable,
    *,
    video: torch.Tensor | None = None,
    momentum: MomentumEncoder | None = None,
    **params: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one batch: ``views`` (B, V, 3, T, H, W) normalised float on the model's device, their ``roles``,
    the stage's ``loss`` (:class:`moquad.train.methods.Stage`) and its hyperparameters ``params``
    (``Stage.params(cfg)``).

    Without a momentum encoder every view goes through ``model`` and the projections (and the videos' manifest
    indices ``video``, for same-video masking) of the whole global batch are gathered under DDP. With one, its
    routing (:class:`moquad.train.methods.Momentum`) says which views go through ``model`` (the queries), which
    through ``momentum`` (keys, gathered under DDP) and whose keys of the global batch then enter its queue.
    """
    fn, b, roles = resolve(loss), views.shape[0], tuple(roles)
    fn = fn() if isinstance(fn, type) else fn  # a stateful loss called once, outside a run
    offset = dist.get_rank() * b
    video_global = dist.gather_ids(video) if video is not None and dist.is_dist() else None
    if momentum is None:
        z = _project(model, views)
        p = Projections(z, roles, dist.gather(z) if dist.is_dist() else None, offset, video, video_global)
        return fn(p, **params)
    route = momentum.routing
    on = [i for i, r in enumerate(roles) if r in route.online]
    ky = [i for i, r in enumerate(roles) if r in route.keys]
    if not on or not ky:
        raise ValueError(f"the momentum routing (online {route.online}, keys {route.keys}) needs a query and a key "
                         f"among the views' roles {roles}")
    if momentum.norm.split:  # SplitBatchNorm: the queries in the keys' groups (MoCo's one-device shuffle-BN)
        set_splits(model, b // momentum.group)
    keys = _keys(momentum, views[:, ky])
    keys_global = gather_keys(keys)
    queued = momentum.queue.shape[0] > 0
    key_roles = tuple(roles[i] for i in ky)
    p = Projections(_project(model, views[:, on]), tuple(roles[i] for i in on), None, offset, video, video_global,
                    keys, key_roles, keys_global, momentum.queue if queued else None,
                    momentum.queue_video if queued else None)
    out = fn(p, **params)
    if queued:
        enq = [j for j, r in enumerate(key_roles) if r in route.queue]
        ids = video_global if video_global is not None else video
        momentum.enqueue(keys_global[:, enq].reshape(-1, keys_global.shape[-1]),
                         None if ids is None else ids.repeat_interleave(len(enq)))
    return out


def _momentum(method: Any, model: nn.Module, cfg: PretrainConfig, world: int) -> MomentumEncoder | None:
    """The run's momentum encoder (None: the method has no slot); keys' BatchNorm groups that do not divide the
    per-rank batch, or too few of them to move each key out of its query's group (``split``), are one start-up
    error."""
    if method.momentum is None:
        return None
    momentum = build_momentum(method.momentum, model, cfg)
    per_rank, g = cfg.batch_size // world, momentum.group
    if g and per_rank % g:
        raise MoquadError(f"the keys' BatchNorm groups of {g} videos (key_bn_group) do not divide the "
                          f"per-rank batch of {per_rank} (global {cfg.batch_size} over {world} "
                          f"processes); pass {setting('key_bn_group', 'N')} with N at least 2 dividing it, or "
                          f"{setting('key_bn', 'batch')}")
    if momentum.norm.split and g * g > per_rank:
        fit = [n for n in range(2, per_rank) if per_rank % n == 0 and n * n <= per_rank]
        fix = f"pass {setting('key_bn_group', fit[-1])}" if fit else \
            f"use a per-rank batch of 4 or more, or {setting('key_bn', 'batch')}"
        raise MoquadError(f"{setting('key_bn', 'split')} moves each key out of its query's group: it needs at least as many groups "
                          f"as videos per group, and groups of {g} make {per_rank // g} of the per-rank batch of "
                          f"{per_rank}; {fix}")
    return momentum


def _keys(momentum: MomentumEncoder, views: torch.Tensor) -> torch.Tensor:
    """The momentum encoder's projections (B, W, D) of ``views`` (B, W, ...): in one forward, one per group of
    ``momentum.group`` videos (``groups``: each group's BatchNorm statistics apart), or in one forward of groups
    with each video moved out of its query's group (``split``: :func:`moquad.train.momentum.key_order`)."""
    step = momentum.group or views.shape[0]
    if views.shape[0] % step:
        raise ValueError(f"key_bn groups of {step} videos do not divide this rank's batch of {views.shape[0]}; set "
                         "key_bn_group to a divisor of the per-rank batch")
    if momentum.norm.split:
        where = key_order(views.shape[0], step).to(views.device)
        moved = torch.empty_like(views)
        moved[where] = views
        set_splits(momentum.encoder, views.shape[0] // step)
        return _project(momentum.encode, moved)[where]
    return torch.cat([_project(momentum.encode, views[i:i + step]) for i in range(0, views.shape[0], step)])


@dataclass
class Trainer:
    """Everything one run needs, built by :func:`setup`."""

    cfg: PretrainConfig
    info: dist.DistInfo
    model: nn.Module  # DDP-wrapped under torchrun
    core: nn.Module  # the plain model (what checkpoints hold)
    optimizer: torch.optim.Optimizer
    lrs: torch.Tensor
    stages: list[Stage]  # each epoch's stage of the method
    spe: int
    start: int
    run: Path
    data_checksum: str | None
    logger: RunLogger | None
    bad_log: Path
    momentum: MomentumEncoder | None = None  # the method's momentum slot
    data: Any = None  # what make_loader reads: the run's RunLoader (built once, workers kept across epochs)
    losses: dict[str, Callable] | None = None  # each stage's loss (by stage name): a function or a stateful one
    progress: Any = None
    task: Any = None

    @property
    def total(self) -> int:
        return self.cfg.epochs * self.spe

    @property
    def ckpt_path(self) -> Path:
        return self.run / "checkpoints" / "last.pt"


def pretrain(cfg: PretrainConfig, *, tensorboard: bool = True, progress: bool = True) -> Path:
    """Pre-train as ``moquad pretrain`` does and return the final checkpoint (``RUN/checkpoints/last.pt``, RUN
    being ``cfg.out``); ``cfg.resume`` continues the run in RUN. ``tensorboard``: also write TensorBoard logs;
    ``progress``: show the progress bar (a line per epoch when the output is not a terminal)."""
    info = dist.init(cfg.device)
    try:
        with dist.on_main(lock.hold(cfg.out, "pretrain"), info.device), preempt.watch():
            t = setup(cfg, info, tensorboard, progress)
            try:
                with t.progress:
                    for epoch in range(t.start // t.spe, cfg.epochs):
                        train_one_epoch(t, epoch)
            except preempt.Preempted as e:
                if info.rank == 0:
                    preempt.mark()
                    print(e.message(t.ckpt_path, cfg.data), file=sys.stderr, flush=True)
                raise
            except KeyboardInterrupt:  # Ctrl-C: say which checkpoint a --resume continues from, and how
                end_workers()
                if info.rank == 0:
                    logged = int(t.progress.tasks[0].completed) if t.progress.tasks else t.start
                    print(preempt.interrupted_message(t.ckpt_path, cfg.data, logged, cfg.ckpt_every), file=sys.stderr,
                          flush=True)
                raise preempt.Interrupted() from None
            except BaseException:  # a failure ends this rank now, its loader workers first (they ignore SIGTERM)
                end_workers()
                raise
            finally:
                if t.logger is not None:
                    t.logger.close()
            dist.barrier()
        return t.ckpt_path
    finally:
        dist.cleanup()


def setup(cfg: PretrainConfig, info: dist.DistInfo, tensorboard: bool, progress: bool) -> Trainer:
    """Data, model, optimizer, schedule, resume and logging of a run (one named step each)."""
    cfg, optimizer_line = pretrain_optimizer(cfg)  # the backbone's optimizer and its setting, unless set
    world, rank, device = info.world_size, info.rank, info.device
    if cfg.batch_size <= 0 or cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} (global) must be a positive multiple of the {world} processes")
    main = rank == 0
    # ------------------------------------------------------------ data: steps per epoch
    spe, checksum, report, data = _data_plan(cfg, info)
    # ------------------------------------------------------------ model, optimizer, schedule
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden, cfg.model_input).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last_3d)
    method = METHODS[cfg.method].configured(cfg)
    momentum = _momentum(method, model, cfg, world)
    predictor = momentum.predictor if momentum is not None else None
    optimizer = make_optimizer(model if predictor is None else Online(model, predictor), cfg.optimizer, 0.0,
                               cfg.weight_decay)
    lrs = lr_schedule(cfg.lr, cfg.batch_size, cfg.epochs * spe, round(cfg.lr_warmup_epochs * spe))
    stages = method.epoch_stages(cfg.epochs, cfg.warmup_ratio)
    losses = _stage_losses(method, device)
    # ------------------------------------------------------------ resume
    run = Path(cfg.out)
    if main:
        remove_stale_temps(run / "checkpoints")  # left by a crash or a full disk
    start = checkpoint.resume(cfg, run / "checkpoints" / "last.pt", model, optimizer, spe, checksum, momentum, losses)
    if main:
        report()
        print(optimizer_line, flush=True)
        if momentum is not None:
            print(describe_momentum(momentum, cfg.batch_size // world), flush=True)
        if cfg.resume:
            print(checkpoint.resume_message(run / "checkpoints" / "last.pt", start, spe, cfg.epochs), flush=True)
    # ------------------------------------------------------------ distributed
    core: nn.Module = model
    sync_bn, why = _sync_bn(cfg, model, momentum, world, device)
    if main and why:
        Console(stderr=True).print(f"pretrain: {why}")
    if sync_bn:
        model = core = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if momentum is not None and momentum.norm.sync:  # groups: each group's own statistics, on any rank
            momentum.encoder = nn.SyncBatchNorm.convert_sync_batchnorm(momentum.encoder)
    if predictor is not None:
        model = Online(core, predictor)
    if dist.is_dist():
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # ------------------------------------------------------------ logging
    logger = None
    if main:
        save_config(cfg, run / "config.yaml")
        logger = RunLogger(run, start_step=start, tensorboard=tensorboard)
        _cut_bad_log(run / "bad_samples.jsonl", start)
    t = Trainer(cfg, info, model, core, optimizer, lrs, stages, spe, start, run, checksum, logger,
                run / "bad_samples.jsonl", momentum, data, losses)
    t.progress, t.task = _progress(main and progress, t.total, start, spe, cfg.batch_size)
    return t


def _sync_bn(cfg: PretrainConfig, model: nn.Module, momentum: MomentumEncoder | None, world: int,
             device: torch.device) -> tuple[bool, str]:
    """(use SyncBatchNorm?, the line saying so): :func:`moquad.dist.sync_bn`, off under ``--key-bn split``, whose
    groups keep their own statistics."""
    sync_bn, why = dist.sync_bn(cfg.sync_bn, model, world, device)
    if sync_bn and momentum is not None and momentum.norm.split:
        return False, "SyncBatchNorm off (--key-bn split: each group of videos keeps its own statistics)"
    return sync_bn, why


def _stage_losses(method: Method, device: torch.device) -> dict[str, Callable]:
    """Each stage's loss, by stage name: the function it names, or the one instance per run of a stateful loss
    (a class: its state goes into the checkpoint, :func:`loss_states`)."""
    out: dict[str, Callable] = {}
    for stage in method.stages:
        fn = resolve(stage.loss)
        out[stage.name] = fn().to(device) if isinstance(fn, type) and issubclass(fn, nn.Module) else \
            fn() if isinstance(fn, type) else fn
    return out


def loss_states(losses: dict[str, Callable] | None) -> dict[str, Any] | None:
    """The state of each stateful stage loss (one with ``state_dict``), by stage name; None when there is none."""
    states = {name: fn.state_dict() for name, fn in (losses or {}).items() if hasattr(fn, "state_dict")}
    return states or None


def _data_plan(cfg: PretrainConfig, info: dist.DistInfo) -> tuple[int, str, Callable[[], None], Any]:
    """Steps per epoch of the exact-epoch loader, the data checksum, the start-up report to print and the run's
    loader (:class:`~moquad.data.pipeline.RunLoader`: the manifest read and the shards checked once per run).

    The plan depends on the GLOBAL batch only, so a run resumed on another number of ranks or workers continues
    with the same global batches."""
    from moquad.data.clip_frames import unfit_counts
    from moquad.data.pipeline import RunLoader

    world = info.world_size
    # recycle: the workers reuse their shared batch buffers (pipeline.BufferRing); safe because every step is done
    # with its batch (to_model makes new tensors: pinned copies, device copies, floats) before it asks for the next
    data = RunLoader(cfg.data, cfg.loader, split=cfg.split, batch_size=cfg.batch_size // world, rank=info.rank,
                     world_size=world, pin_memory=info.device.type == "cuda", recycle=True)
    split, spe = data.split, data.num_batches
    if cfg.steps_per_epoch:
        if cfg.steps_per_epoch > spe:
            raise MoquadError(f"steps_per_epoch {cfg.steps_per_epoch} exceeds the {spe} batches of {len(split)} videos at "
                              f"batch {cfg.batch_size}; an epoch uses each video at most once")
        spe = cfg.steps_per_epoch
    unfit = unfit_counts(split.num_frames, cfg.loader.frames, cfg.loader.dilations)
    return spe, split.checksum_value, functools.partial(_report, cfg, len(split), spe, unfit), data


def _report(cfg: PretrainConfig, videos: int, spe: int, unfit: dict[int, int]) -> None:
    """Start-up lines: steps per epoch and in total, short videos per dilation, small-run warnings."""
    console = Console()
    total = spe * cfg.epochs
    console.print(f"pretrain: {videos} videos in split {cfg.split!r}, global batch {cfg.batch_size}: {spe} steps per "
                  f"epoch, {total} steps in {cfg.epochs} epochs")
    if any(unfit.values()):  # said only when some video is short: "dilation 1: 0, dilation 4: 0" is noise
        fits = ", ".join(f"dilation {d}: {n}" for d, n in unfit.items())
        console.print(f"videos too short for a {cfg.loader.frames}-frame clip ({fits}); they use the dilations that "
                      "fit (see moquad.data.clip_frames)")
    if total < MIN_STEPS:
        console.print(f"[yellow]warning:[/] {small_run_advice(videos, cfg.batch_size, cfg.epochs)}", highlight=False,
                      soft_wrap=True)
    if cfg.lr_warmup_epochs and cfg.lr_warmup_epochs >= cfg.epochs:
        console.print(f"[yellow]warning:[/] the learning-rate warm-up ({cfg.lr_warmup_epochs:g} epochs) is as long as "
                      f"the run ({cfg.epochs}): the lr never reaches {cfg.lr}; pass {setting('lr_warmup_epochs', 'N')} below "
                      f"{cfg.epochs} (0: none)", highlight=False, soft_wrap=True)
    slot = METHODS[cfg.method].configured(cfg).momentum
    advice = queue_advice(cfg.queue_size, videos) if slot is not None and slot.queue else None
    if advice:
        console.print(f"[yellow]warning:[/] {advice}", highlight=False, soft_wrap=True)


def queue_advice(queue: int, videos: int) -> str | None:
    """The start-up line of a queue at least as large as the training split (None: it is smaller): it then holds
    several keys of every video, most of them stale; the suggestion is the largest power of two up to half the
    split (at least 1)."""
    if queue < videos:
        return None
    size = 1 << max(0, (videos // 2).bit_length() - 1)
    return (f"the queue of {queue} keys is at least as large as the {videos} training videos: it holds several, "
            f"mostly stale keys of every video; use {setting('queue_size', size)} (about half the split) or fewer")


MIN_STEPS = 50  # fewer optimizer steps than this: the start-up report warns (a contrastive loss barely moves)


def small_run_advice(videos: int, batch: int, epochs: int) -> str:
    """The small-run warning: how many steps and why, and what reaches :data:`MIN_STEPS` from THESE settings:
    more epochs, or a smaller batch (down to 4, never one giving no more steps per epoch) with fewer of them."""
    spe = max(1, videos // batch)
    text = f"only {videos // batch * epochs} optimizer steps ({videos} videos in batches of {batch}: {spe} per epoch"
    text += f", {epochs} epochs); " + (f"the split is small for batch {batch}; " if spe <= 2 else "")
    fix = setting("epochs", -(-MIN_STEPS // spe))
    smaller = [b for b in (256, 128, 64, 32, 16, 8, 4) if b < batch and videos // b > spe]
    if smaller:
        b = next((b for b in smaller if videos // b * epochs >= MIN_STEPS), smaller[-1])  # the largest that reaches it
        more = -(-MIN_STEPS // (videos // b))
        fix += f", or {setting('batch_size', b)} ({videos // b} steps per epoch)" + \
            (f" with {setting('epochs', more)}" if more > epochs else "")
    return text + f"for at least {MIN_STEPS} steps use {fix}"


def _progress(enabled: bool, total: int, completed: int, steps_per_epoch: int, batch_size: int):
    from moquad.train.progress import progress

    return progress(enabled, total, completed, steps_per_epoch, batch_size)


def save_checkpoint(t: Trainer, step: int, epoch: int) -> None:
    """Rank 0 writes the run's checkpoint (:func:`checkpoint.build`) to ``last.pt``, atomically."""
    if t.info.rank != 0:
        return
    checkpoint.save(checkpoint.build(t.cfg, t.core, step, epoch, optimizer=t.optimizer, steps_per_epoch=t.spe,
                                     data_checksum=t.data_checksum,
                                     momentum=t.momentum.state_dict() if t.momentum is not None else None,
                                     losses=loss_states(t.losses)),
                    t.ckpt_path)


def train_one_epoch(t: Trainer, epoch: int) -> None:
    """One epoch from its first not-yet-trained step; logs, checks and checkpoints on the way."""
    cfg, device, world = t.cfg, t.info.device, t.info.world_size
    stage = t.stages[epoch]
    lcfg = stage.loader_config(cfg.loader)
    first = max(0, t.start - epoch * t.spe)
    loader = make_loader(t.data, lcfg, split=cfg.split, batch_size=cfg.batch_size // world, epoch=epoch,
                         rank=t.info.rank, world_size=world, start=first, num_batches=t.spe,
                         pin_memory=device.type == "cuda", recycle=True, views=stage.views(lcfg))
    from moquad.data.augment import to_model

    w = _Window(device, _bad_before(t, epoch, first))  # a mid-epoch resume goes on counting the epoch's skips
    batches = iter(loader)
    for step in range(epoch * t.spe + first, (epoch + 1) * t.spe):
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            raise ValueError(f"the loader gave only {step - epoch * t.spe} of {t.spe} batches in epoch {epoch}")
        w.wait += time.perf_counter() - t0
        w.bad += _record_bad(t, batch.get("bad") or [], step)
        lr = float(t.lrs[step])
        for group in t.optimizer.param_groups:
            group["lr"] = lr
        views = to_model(batch, device, lcfg.size)
        video = batch["index"].to(device, non_blocking=True) if "index" in batch else None
        if t.momentum is not None:
            t.momentum.update(t.core, step, t.total)
        loss, stats = forward_loss(t.model, views, batch["roles"], t.losses[stage.name], video=video,
                                   momentum=t.momentum, **stage.params(cfg))
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.optimizer.step()
        w.add(step, loss.detach(), stats, cfg.batch_size * views.shape[1])
        done, end, stop = step + 1, step == (epoch + 1) * t.spe - 1, False
        if done % cfg.log_every == 0 or end:
            stop = _log_step(t, epoch, stage, done, lr, w)
            w = _Window(device, w.bad)
        if stop or done % cfg.ckpt_every == 0 or end:
            _check_finite(t, w)
            save_checkpoint(t, done, epoch + 1 if end else epoch)
        if stop and done < t.total:  # all ranks agreed at this log step (preempt); wait for rank 0's checkpoint
            dist.barrier()
            raise preempt.preempted(done)


class _Window:
    """Sums over the steps since the last log step, kept on the device (no host sync per step)."""

    def __init__(self, device: torch.device, bad: int = 0) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, rank AD-Pos, rank Intra-Neg, steps
        self.nonfinite = torch.full((2,), -1.0, dtype=torch.float64, device=device)  # first bad (step, kind)
        self.start, self.wait, self.clips, self.bad = time.perf_counter(), 0.0, 0, bad

    def add(self, step: int, loss: torch.Tensor, stats: dict[str, torch.Tensor], clips: int) -> None:
        with torch.no_grad():
            vals = torch.stack([loss.double(), stats["rank_pos"].double().to(loss.device),
                                stats["rank_intra_neg"].double().to(loss.device), torch.ones_like(loss, dtype=torch.float64)])
            self.sums += vals
            new = ~torch.isfinite(loss) & (self.nonfinite[0] < 0)
            code = torch.where(torch.isnan(vals[0]), 1.0, torch.where(vals[0] > 0, 2.0, 3.0))  # nan, inf, -inf
            self.nonfinite = torch.where(new, torch.stack([torch.full_like(code, step), code]), self.nonfinite)
        self.clips += clips


def _cut_bad_log(path: Path, start: int) -> None:
    """On resume, keep the skips of the steps the checkpoint holds (those after it are redone and recorded again)."""
    if path.is_file():
        kept = [line for line in path.read_text().splitlines(keepends=True) if _step_of(line) <= start]
        atomic_write_text(path, "".join(kept))


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # a torn last line of a killed run: dropped


def _bad_before(t: Trainer, epoch: int, first: int) -> int:
    """Skips of this epoch's steps before ``first`` (a mid-epoch resume), counted once: on rank 0 (ranks' counts
    are summed at log steps)."""
    if first == 0 or t.info.rank != 0 or not t.bad_log.is_file():
        return 0
    lo, hi = epoch * t.spe, epoch * t.spe + first
    return sum(lo < _step_of(line) <= hi for line in t.bad_log.read_text().splitlines())


def _record_bad(t: Trainer, bad: list[dict], step: int) -> int:
    """Append skipped samples to RUN/bad_samples.jsonl (every rank appends whole lines)."""
    if bad:
        t.run.mkdir(parents=True, exist_ok=True)
        with open(t.bad_log, "a") as f:
            f.writelines(json.dumps({**b, "step": step + 1, "rank": t.info.rank}) + "\n" for b in bad)
    return len(bad)


def _check_finite(t: Trainer, w: _Window) -> None:
    """DINO's guard: stop at the first non-finite loss, keeping the last good checkpoint (a sync point)."""
    first = dist.all_reduce(w.nonfinite, "max")
    if float(first[0]) >= 0:
        step = int(first[0])
        kept = t.ckpt_path if t.ckpt_path.is_file() else "none yet (no checkpoint was written)"
        kind = {1: "nan", 2: "inf", 3: "-inf"}[int(first[1])]
        raise MoquadError(f"loss is {kind} at step {step + 1} (lr {float(t.lrs[step]):.4g}); "
                          f"last good checkpoint: {kept}")


def _log_step(t: Trainer, epoch: int, stage: Stage, done: int, lr: float, w: _Window) -> bool:
    """Reduce the window over ranks, check it, log it (the only per-step host sync); True: all ranks stop here
    (some rank got a preemption signal)."""
    _check_finite(t, w)
    world = t.info.world_size
    extra = torch.tensor([float(w.bad), float(preempt.requested())], dtype=torch.float64, device=w.sums.device)
    sums = dist.all_reduce(torch.cat([w.sums, extra])).tolist()  # one reduce: window sums, bad samples, stop flags
    stop = sums[5] > 0
    _check_bad(t, epoch, int(sums[4]))
    if t.logger is None:
        return stop
    n, dt = max(sums[3] / world, 1.0), max(time.perf_counter() - w.start, 1e-9)
    rec = {"epoch": epoch, "mode": stage.name, "stage": stage.kind, "loss": sums[0] / sums[3], "lr": lr, "clips_per_s": w.clips / dt,
           "data_wait": min(1.0, w.wait / dt), "rank_ad_pos": sums[1] / sums[3],
           "rank_intra_neg": sums[2] / sums[3] if math.isfinite(sums[2]) else float("nan"),
           "bad_samples": int(sums[4]), "steps": int(n), "time": time.time()}
    t.logger.log(done, rec)
    t.progress.update(t.task, completed=done, info=f"{stage.label} loss {rec['loss']:.4f} lr {lr:.3g}")
    return stop


def _check_bad(t: Trainer, epoch: int, bad: int) -> None:
    """The bad-sample rule: stop only when an epoch's unreadable samples exceed BOTH limits of the config."""
    lc, samples = t.cfg.loader, t.spe * t.cfg.batch_size
    if bad > lc.max_bad_fraction * samples and bad > lc.max_bad_count:
        raise MoquadError(f"{bad} of epoch {epoch}'s {samples} samples were unreadable, more than "
                          f"loader.max_bad_fraction={lc.max_bad_fraction} of them and more than "
                          f"loader.max_bad_count={lc.max_bad_count}; see {t.bad_log}, run `moquad verify "
                          f"{t.cfg.data}`, or raise the limits with --set loader.max_bad_count=N and --resume")
