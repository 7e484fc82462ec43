"""The momentum-encoder slot of a method (:class:`moquad.train.methods.Momentum`): an EMA copy of the encoder and
projection head, its EMA schedule, an optional predictor on the online side, and a queue of negative keys.

Design choices (the paper fixes none of them; MoQuad is defined on SimCLR; docs/guides/methods.md has the measurements):

- Which views go where: the slot's routing (:class:`moquad.train.methods.Momentum`). The shipped rows send the
  ANCHOR through the online network (the query, with gradients) and every other view (the positive, the Intra-Neg
  and AD-Intra-Neg) through the momentum encoder, without gradients, as MoCo encodes its keys. So ``moco_moquad``'s
  key is the AD-Pos and its intra negatives are momentum keys too: all negatives of the denominator (batch, queue,
  intra) then come from one encoder, which keeps their similarities comparable. A symmetric routing (MoCo v3) sends
  the anchor and the positive both ways.
- What enters the queue: the keys of the routing's ``queue`` roles: each video's POSITIVE key in the shipped rows
  (one per video, as in MoCo); the intra negatives never do (motion-disturbed copies of a video: in the queue they
  would only be more inter negatives, and stale). The queue stores each key's video index, so a later step never
  uses a key of the anchor's own video as a negative, and empty slots (the first steps) are masked instead of
  filled with noise; without video ids a queue is an error, never a silent no-op.
- Predictor (MoCo v3, BYOL): an MLP on the online projections, trained with the network (:class:`Online`).
- The keys' BatchNorm (``key_bn``, one row of :data:`KEY_NORMS`): ``groups`` (the rows' choice): each group of
  ``key_bn_group`` consecutive videos of a rank's batch is encoded in its own forward (batches are in random order,
  so a group is a random subset) and a group is the same videos on any number of ranks (never SyncBN). It is NOT
  MoCo v1's shuffle-BN: the queries are normalised over the whole rank batch, so every key group is a subset of its
  query's BatchNorm batch and a query still shares statistics with its own key and with every key of the batch
  (less than with ``batch``; no key is singled out as the query's own, none is kept apart). A group as large as the
  per-rank batch is ``batch`` (the start-up line says so). ``split``: MoCo's one-device scheme (SplitBatchNorm):
  the queries are normalised in the same groups too and the keys are moved across groups (member r of group q is
  encoded in group q + r), so a key's group holds no other video of its query's group; it needs as many groups as
  videos per group and depends on the per-rank batch. ``batch``: the whole batch (SyncBN under torchrun on GPUs, as
  MoCo v3); ``running``: eval mode with the online network's running statistics.
- EMA schedule: ``m(step) = 1 - (1 - m0) * (cos(pi * step / total) + 1) / 2`` (BYOL, MoCo v3): m0 at the start,
  1 at the end; ``m0 = cfg.momentum`` (0.99, MoCo v3's). The EMA covers parameters; the update runs before the
  keys are encoded, at every step (MoCo v2 / v3 order).
- Queue size: ``cfg.queue_size`` (4096 by default: MoCo's 65536 is for a million images; a small dataset wants a
  queue below its size, e.g. 128 in the CPU demo's recipe). Temperature: the run's ``temperature``.
- DDP: keys are gathered from every rank (all_gather, rank order = the global batch's order) before they enter the
  queue, so the queue holds the GLOBAL batch's keys and does not depend on the number of ranks: an elastic resume
  on another number of ranks continues with the same queue (the global batch may not change, as for every run).
- Checkpoint: :meth:`MomentumEncoder.state_dict` (EMA weights, queue, its videos and pointer, predictor) is
  saved beside the model, so a resume, mid-epoch too, continues bit for bit.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from moquad import dist
from moquad.models.heads import ProjectionHead
from moquad.train.losses import NO_VIDEO_IDS
from moquad.train.methods import Momentum


class Online(nn.Module):
    """The online network with a predictor on its projections (what the optimizer trains when a method has one)."""

    def __init__(self, model: nn.Module, predictor: nn.Module) -> None:
        super().__init__()
        self.model, self.predictor = model, predictor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.model(x))


@dataclass(frozen=True)
class KeyNorm:
    """How a momentum encoder takes its keys' BatchNorm statistics: one row of :data:`KEY_NORMS`."""

    line: str  # the start-up line's words ({group}: videos per group)
    grouped: bool = False  # keys encoded in groups of key_bn_group videos of the rank's batch
    split: bool = False  # queries normalised in the same groups too, each key in another group (SplitBatchNorm)
    running: bool = False  # eval mode with the online network's running statistics (copied at each update)
    sync: bool = False  # SyncBatchNorm on the keys' encoder too when the run syncs BatchNorm


# key_bn -> its row (moquad.config.KEY_BN names the same choices)
KEY_NORMS: dict[str, KeyNorm] = {
    "batch": KeyNorm("over the batch", sync=True),
    "groups": KeyNorm("in groups of {group} videos (queries over the batch)", grouped=True),
    "running": KeyNorm("with the online network's running statistics", running=True),
    "split": KeyNorm("in groups of {group} videos, queries too, each key in another group than its query "
                     "(SplitBatchNorm)", grouped=True, split=True),
}


class SplitBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are taken over ``splits`` equal groups of consecutive rows apart (MoCo's
    one-device shuffle-BN); running statistics: the groups' mean. A BatchNorm module becomes one in place
    (:func:`split_batchnorm`), so its parameters, buffers and state-dict keys stay those of the network."""

    splits: int = 1

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.splits
        if not self.training or s <= 1:
            return super().forward(x)
        n, c, rest = x.shape[0], x.shape[1], x.shape[2:]
        if n % s:
            raise ValueError(f"SplitBatchNorm: {n} rows do not split into {s} groups")
        y = x.reshape(s, n // s, c, *rest).transpose(0, 1).reshape(n // s, s * c, *rest)
        factor = self.momentum if self.momentum is not None else 0.0
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = factor if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        mean = None if self.running_mean is None else self.running_mean.repeat(s)
        var = None if self.running_var is None else self.running_var.repeat(s)
        out = F.batch_norm(y, mean, var, None if self.weight is None else self.weight.repeat(s),
                           None if self.bias is None else self.bias.repeat(s), True, factor, self.eps)
        if mean is not None:
            with torch.no_grad():
                self.running_mean.copy_(mean.view(s, c).mean(0))
                self.running_var.copy_(var.view(s, c).mean(0))
        return out.reshape(n // s, s, c, *rest).transpose(0, 1).reshape(n, c, *rest)


def split_batchnorm(model: nn.Module) -> nn.Module:
    """``model`` with every BatchNorm module made a :class:`SplitBatchNorm` in place (one group until told)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, SplitBatchNorm):
            m.__class__ = SplitBatchNorm
    return model


def set_splits(model: nn.Module, splits: int) -> None:
    """Normalise each following training forward of ``model`` in ``splits`` groups of consecutive rows."""
    for m in model.modules():
        if isinstance(m, SplitBatchNorm):
            m.splits = splits


def key_order(videos: int, group: int) -> torch.Tensor:
    """Where each video of a rank's batch goes in the keys' forward under ``split``: member r of query group q
    (video ``q * group + r``) to key group ``(q + r) % groups`` at place r, so no two videos of one query group
    share a key group (with at least as many groups as videos per group)."""
    groups = videos // group
    q, r = torch.arange(videos) // group, torch.arange(videos) % group
    return (q + r) % groups * group + r


class MomentumEncoder:
    """EMA copy of ``model`` (encoder + projection), the EMA schedule and the queue (``queue_size`` 0: none).

    ``key_bn`` (a row of :data:`KEY_NORMS`): ``batch``: the copy normalises the keys with their batch's statistics
    (train mode); ``groups``: with the statistics of each ``group`` consecutive videos apart (the trainer encodes
    each group in its own forward; batches are in random order, so a group is a random subset of the batch);
    ``split``: queries and keys both in groups (:class:`SplitBatchNorm`), each key in another group than its query
    (:func:`key_order`); ``running``: in eval mode, with the online network's running statistics (copied at each
    update), so a key does not depend on the other clips of its batch at all."""

    def __init__(self, model: nn.Module, m0: float, queue_size: int, dim: int, predictor: nn.Module | None = None,
                 key_bn: str = "batch", group: int = 0, routing: Momentum | None = None):
        self.encoder = copy.deepcopy(model).requires_grad_(False)
        self.m0, self.predictor, self.key_bn, self.group = m0, predictor, key_bn, group
        self.routing = routing or Momentum()  # which roles go online, to this copy, into the queue
        self.norm = KEY_NORMS[key_bn]
        if self.norm.running:
            self.encoder.eval()
        device = next(model.parameters()).device
        self.queue = torch.zeros(queue_size, dim, device=device)
        self.queue_video = torch.full((queue_size,), -1, dtype=torch.int64, device=device)
        self.ptr = 0

    def momentum(self, step: int, total: int) -> float:
        """EMA coefficient at ``step`` of ``total``: cosine from m0 to 1."""
        return 1.0 - (1.0 - self.m0) * (math.cos(math.pi * step / max(total, 1)) + 1.0) / 2.0

    @torch.no_grad()
    def update(self, model: nn.Module, step: int, total: int) -> None:
        """EMA step of the parameters toward ``model``'s (the plain online model, same structure); with
        ``key_bn="running"`` (the row's ``running``) the copy also takes the online network's BatchNorm statistics."""
        m = self.momentum(step, total)
        for pe, po in zip(self.encoder.parameters(), model.parameters()):
            pe.mul_(m).add_(po.detach(), alpha=1.0 - m)
        if self.norm.running:
            for be, bo in zip(self.encoder.buffers(), model.buffers()):
                be.copy_(bo)

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).float()

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, video: torch.Tensor | None) -> None:
        """Write the global batch's keys (G, D) and their videos (G,) at the pointer, wrapping around."""
        k = self.queue.shape[0]
        if k == 0:
            return
        if video is None:
            raise ValueError(NO_VIDEO_IDS)
        keys, video = keys.detach().float()[-k:], video[-k:]
        rows = (self.ptr + torch.arange(len(keys))) % k
        self.queue[rows.to(self.queue.device)] = keys.to(self.queue.device)
        self.queue_video[rows.to(self.queue.device)] = video.to(self.queue.device)
        self.ptr = int((self.ptr + len(keys)) % k)

    def state_dict(self) -> dict:
        out = {"encoder": self.encoder.state_dict(), "queue": self.queue.cpu(), "queue_video": self.queue_video.cpu(),
               "ptr": torch.tensor(self.ptr)}
        if self.predictor is not None:
            out["predictor"] = self.predictor.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        self.encoder.load_state_dict(state["encoder"])
        if self.queue.shape != state["queue"].shape:
            raise ValueError(f"the checkpoint's queue holds {state['queue'].shape[0]} keys, the run wants "
                             f"{self.queue.shape[0]}")
        self.queue.copy_(state["queue"])
        self.queue_video.copy_(state["queue_video"])
        self.ptr = int(state["ptr"])
        if self.predictor is not None:
            self.predictor.load_state_dict(state["predictor"])


def build(spec, model: nn.Module, cfg) -> MomentumEncoder:
    """The momentum slot ``spec`` (:class:`moquad.train.methods.Momentum`, configured) of a run of ``cfg`` over
    ``model``."""
    predictor = ProjectionHead(cfg.proj_dim, cfg.proj_hidden, cfg.proj_dim) if spec.predictor else None
    if predictor is not None:
        predictor.to(next(model.parameters()).device)
    norm = KEY_NORMS[spec.key_bn]
    if norm.split:  # the online network (and its predictor) normalises its queries in groups too
        split_batchnorm(model)
        if predictor is not None:
            split_batchnorm(predictor)
    group = cfg.key_bn_group if norm.grouped else 0
    return MomentumEncoder(model, cfg.momentum, cfg.queue_size if spec.queue else 0, cfg.proj_dim, predictor,
                           spec.key_bn, group, spec)


def describe(momentum: MomentumEncoder, per_rank: int) -> str:
    """The start-up line of a run's momentum encoder with a per-rank batch of ``per_rank`` videos: what its method's
    row and the settings chose, and what they come to (groups as large as the batch are the whole batch)."""
    whole = momentum.norm.grouped and not momentum.norm.split and momentum.group >= per_rank
    bn = (f"over the batch (groups of {momentum.group} videos hold the whole per-rank batch of {per_rank}; "
          "--key-bn-group N below it splits it)") if whole else momentum.norm.line.format(group=momentum.group)
    queue = f"a queue of {momentum.queue.shape[0]} keys" if momentum.queue.shape[0] else "no queue"
    return (f"pretrain: momentum encoder: EMA from m0 {momentum.m0}, "
            f"{'an MLP predictor' if momentum.predictor is not None else 'no predictor'}, keys' BatchNorm {bn}, "
            f"{queue} (--predictor, --key-bn, --key-bn-group, --queue-size, --momentum change them)")


def gather_keys(keys: torch.Tensor) -> torch.Tensor:
    """The global batch's keys (all ranks, rank order); no gradient flows through keys."""
    return dist.gather_ids(keys.contiguous()) if dist.is_dist() else keys  # all_gather (any dtype)
