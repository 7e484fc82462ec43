"""Contrastive losses of the paper, on L2-normalised projections with temperature tau.

- :func:`moquad_loss`: Eq. 1 (MoQuad quadruples), with Eq. 4 hard-negative mining when
  ``hard_beta > 0``.
- :func:`appearance_loss`: Eq. 3 (warm-up task: clip at dilation n vs clip at dilation m).
- :func:`nt_xent_loss`: SimCLR's NT-Xent for the baseline.
- :func:`momentum_loss`: InfoNCE of online queries against momentum keys, the other videos' keys of the global
  batch and a queue of earlier keys (MoCo v2/v3), with the quadruple's intra negatives and Eq. 4 mining when
  given (method ``moco_moquad``).

A method's stage names its loss (:data:`moquad.train.methods.METHODS`): one of the step losses at the end of this
module, each ``loss(p: Projections, **params) -> (loss, Fig. 4 ranks)`` with the stage's own ``params``. Views reach a loss
with their ROLES (``anchor``, ``positive``, ``intra_negative``: :data:`moquad.data.views.ROLES`), never names.

Conventions shared by all:

- Inputs are this rank's projections ``z_local`` (B, V, D) (unnormalised; computed in fp32) and
  optionally the GLOBAL batch ``z_global`` (G, V, D) gathered with gradients
  (:func:`moquad.dist.gather`); ``offset`` is the global index of this rank's first video.
  Single process: leave ``z_global=None``.
- Same-video masking: ``video`` (B,) and ``video_global`` (G,) are the videos' manifest indices
  (the loader's ``index``, gathered like the projections). Any inter negative whose video is the
  anchor's is dropped, so a video that appears twice in a global batch is never its own negative
  (the exact-epoch sampler never does that; this is the safety net for any other sampler).
  Without them every row is its own video.
- The loss is the MEAN over this rank's anchors (the paper writes a sum; the mean keeps the
  gradient scale independent of the batch, which the linear lr scaling rule then handles).
  DDP averages gradients over ranks, so the effective loss is the mean over all global anchors.
- Inter-video negatives are all V views of every OTHER video of the global batch.
- Eq. 4: K = max(1, floor(beta * |inter|)) when beta > 0 (floor as in ``int(beta * n)``; at
  least one so mining stays active on small batches), |inter| counted per anchor over ITS unmasked
  inter negatives (a repeated video's copies are none); the K most similar inter negatives and
  the intra negatives get weight alpha. beta = 0 gives exactly Eq. 1 (intra weight 1).
- Each loss also returns the Fig. 4 diagnostic: the mean 1-based rank (1 = most similar) of
  the positive and of the intra negatives among each anchor's candidates
  (positive + intra negatives + inter negatives), as 0-d tensors (no host sync: the trainer reads
  them at log steps only). ``nan`` when a kind is absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

QUAD_ROLES = ("anchor", "positive", "intra_negative", "intra_negative")  # MoQuad's A, AD-Pos, N, N-bar
# a queue keeps each key's video to mask the anchor's own: without the ids it would silently do nothing
NO_VIDEO_IDS = ("a momentum queue needs each video's manifest index (batch['index'], as moquad's loader gives): a "
                "custom loader must add it, or run without a queue (--set queue_size=0)")


def hard_k(num_inter: int, beta: float) -> int:
    """Number of hard inter negatives of Eq. 4 (0 disables mining)."""
    if beta <= 0 or num_inter <= 0:
        return 0
    return min(num_inter, max(1, int(math.floor(beta * num_inter))))


def _prep(z_local: torch.Tensor, z_global: torch.Tensor | None, offset: int):
    zl = F.normalize(z_local.float(), dim=-1)
    zg = zl if z_global is None else F.normalize(z_global.float(), dim=-1)
    if z_global is None and offset != 0:
        raise ValueError("offset must be 0 when z_global is not given")
    return zl, zg


def same_video(b: int, g: int, offset: int, video: torch.Tensor | None, video_global: torch.Tensor | None,
               device: torch.device) -> torch.Tensor:
    """(B, G) bool: global row g holds local anchor b's video (its own row, and any duplicate)."""
    if video is None:
        return F.one_hot(offset + torch.arange(b, device=device), g).bool()
    vg = video if video_global is None else video_global
    if video.shape != (b,) or vg.shape != (g,):
        raise ValueError(f"video ids must be shaped ({b},) and ({g},), got {tuple(video.shape)} and {tuple(vg.shape)}")
    return video.to(device)[:, None] == vg.to(device)[None, :]


def _ranks(target: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
    """1-based rank of ``target`` (B, k) among ``cands`` (B, C) that contain it (strictly greater count)."""
    greater = (cands.unsqueeze(1) > target.unsqueeze(2)).sum(-1)
    return 1.0 + greater.float()


def _quad(
    zl: torch.Tensor,
    zg: torch.Tensor,
    offset: int,
    pos_view: int,
    intra_views: Sequence[int],
    tau: float,
    hard_beta: float,
    hard_alpha: float,
    own: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Shared core of Eq. 1/3/4: anchor = view 0, one positive view, intra negatives, inter negatives.

    ``own`` (B, G): global rows that hold the anchor's video (masked out of the inter negatives).
    """
    b, v, d = zl.shape
    g = zg.shape[0]
    a = zl[:, 0]
    s_pos = (a * zl[:, pos_view]).sum(-1)  # (B,)
    intra_idx = list(intra_views)
    s_intra = torch.einsum("bd,bkd->bk", a, zl[:, intra_idx]) if intra_idx else a.new_zeros(b, 0)
    # inter negatives: every view of every other video; the anchor's own video is masked to -inf
    # (no boolean indexing, so no host sync on GPU); exp(-inf) = 0 drops it from the sum
    s_all = (a @ zg.reshape(g * v, d).T).reshape(b, g, v)
    s_inter = s_all.masked_fill(own[:, :, None], float("-inf")).reshape(b, g * v)

    return _contrast(s_pos, s_intra, s_inter, hard_k_per_anchor(s_inter, hard_beta), tau, hard_alpha)


def hard_k_per_anchor(s_inter: torch.Tensor, beta: float) -> torch.Tensor:
    """Eq. 4's K of each anchor (B,) over ITS inter negatives: the finite entries of its row of ``s_inter`` (a
    masked one, -inf, is none: the anchor's own video, an empty queue slot); :func:`hard_k` of that count."""
    n = torch.isfinite(s_inter).sum(1)
    if beta <= 0:
        return torch.zeros_like(n)
    k = torch.clamp((beta * n.double()).floor().long(), min=1)  # float64: the same floor as hard_k's Python float
    return torch.minimum(k, n)


def _contrast(s_pos: torch.Tensor, s_intra: torch.Tensor, s_inter: torch.Tensor, k: int | torch.Tensor, tau: float,
              hard_alpha: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """THE InfoNCE of every loss here: cosine similarities of each anchor to its positive (B,), intra negatives
    (B, I) and inter negatives (B, N; -inf = masked); Eq. 4 weights alpha on the ``k`` most similar inter negatives
    and on every intra negative when ``k > 0`` (``k``: one count for all anchors, or each anchor's (B,): then its
    weights apply where its own count is positive). Returns the mean loss and the Fig. 4 ranks."""
    log_w_inter = torch.zeros_like(s_inter)
    log_w_intra: float | torch.Tensor = 0.0
    if isinstance(k, torch.Tensor):
        kmax = int(k.max()) if k.numel() else 0
        if kmax > 0:
            log_alpha = math.log(hard_alpha)
            top = s_inter.detach().topk(kmax, dim=1).indices
            first = torch.arange(kmax, device=k.device)[None, :] < k[:, None]  # the first k_i of each row
            log_w_inter = log_w_inter.scatter(1, top, first.to(s_inter.dtype) * log_alpha)
            log_w_intra = (k > 0).to(s_intra.dtype)[:, None] * log_alpha
    elif k > 0:
        log_alpha = math.log(hard_alpha)
        top = s_inter.detach().topk(k, dim=1).indices
        log_w_inter = log_w_inter.scatter(1, top, log_alpha)
        log_w_intra = log_alpha
    logits = torch.cat(
        [s_pos[:, None] / tau, s_intra / tau + log_w_intra, s_inter / tau + log_w_inter], dim=1
    )
    loss = (torch.logsumexp(logits, dim=1) - s_pos / tau).mean()

    with torch.no_grad():
        cands = torch.cat([s_pos[:, None], s_intra, s_inter], dim=1)
        stats = {"rank_pos": _ranks(s_pos[:, None], cands).mean()}
        stats["rank_intra_neg"] = _ranks(s_intra, cands).mean() if s_intra.shape[1] else torch.tensor(float("nan"))
    return loss, stats


def role_views(roles: Sequence[str], first: str = "anchor") -> tuple[int, list[int]]:
    """(positive view index, intra-negative view indices) of views with ``roles``; view 0 must be ``first``."""
    roles = list(roles)
    if not roles or roles[0] != first:
        raise ValueError(f"the first view must be the {first!r}, got roles={roles}")
    pos = [i for i, r in enumerate(roles) if r == "positive"]
    if len(pos) != 1:
        raise ValueError(f"need exactly one 'positive' view in roles={roles}")
    intra = [i for i, r in enumerate(roles) if r == "intra_negative"]
    unknown = [r for i, r in enumerate(roles) if i > 0 and i not in intra and i != pos[0]]
    if unknown:
        raise ValueError(f"unknown roles {unknown} in {roles}")
    return pos[0], intra


def moquad_loss(
    z_local: torch.Tensor,
    roles: Sequence[str] = QUAD_ROLES,
    *,
    z_global: torch.Tensor | None = None,
    offset: int = 0,
    tau: float = 0.1,
    hard_beta: float = 0.01,
    hard_alpha: float = 1.5,
    video: torch.Tensor | None = None,
    video_global: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 1 (``hard_beta=0``) / Eq. 4 on quadruples ``z_local`` (B, V, D) whose views have ``roles``.

    Ablations that drop views simply pass fewer views (e.g. ``("anchor", "positive")``: the SimCLR base).
    """
    if z_local.dim() != 3 or z_local.shape[1] != len(roles):
        raise ValueError(f"z_local must be (B, {len(roles)}, D), got {tuple(z_local.shape)}")
    pos, intra = role_views(roles)
    zl, zg = _prep(z_local, z_global, offset)
    own = same_video(zl.shape[0], zg.shape[0], offset, video, video_global, zl.device)
    return _quad(zl, zg, offset, pos, intra, tau, hard_beta, hard_alpha, own)


def appearance_loss(
    z_local: torch.Tensor, *, z_global: torch.Tensor | None = None, offset: int = 0, tau: float = 0.1,
    video: torch.Tensor | None = None, video_global: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 3: anchors z_i^n (view 0), positive z_i^m (view 1), negatives z_j^s, j != i, s in {n, m}.

    As written in the paper the anchor is only the clip at dilation n (one direction).
    """
    if z_local.dim() != 3 or z_local.shape[1] != 2:
        raise ValueError(f"appearance loss needs (B, 2, D) projections, got {tuple(z_local.shape)}")
    zl, zg = _prep(z_local, z_global, offset)
    own = same_video(zl.shape[0], zg.shape[0], offset, video, video_global, zl.device)
    return _quad(zl, zg, offset, 1, [], tau, 0.0, 1.0, own)


def nt_xent_loss(
    z_local: torch.Tensor, *, z_global: torch.Tensor | None = None, offset: int = 0, tau: float = 0.1,
    video: torch.Tensor | None = None, video_global: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SimCLR NT-Xent on (B, 2, D) (method ``simclr_classic``): every view is an anchor, its pair the
    positive, all other views of the global batch of other videos the negatives; mean over the 2B
    local anchors."""
    if z_local.dim() != 3 or z_local.shape[1] != 2:
        raise ValueError(f"NT-Xent needs (B, 2, D) projections, got {tuple(z_local.shape)}")
    zl, zg = _prep(z_local, z_global, offset)
    b, g = zl.shape[0], zg.shape[0]
    anchors = torch.cat([zl[:, 0], zl[:, 1]])  # (2B, D)
    cands = torch.cat([zg[:, 0], zg[:, 1]])  # (2G, D)
    logits = anchors @ cands.T / tau
    idx = offset + torch.arange(b, device=zl.device)
    rows = torch.arange(2 * b, device=zl.device)
    pos_col = torch.cat([idx + g, idx])
    own = same_video(b, g, offset, video, video_global, zl.device).repeat(2, 2)  # (2B, 2G)
    own = own & ~F.one_hot(pos_col, 2 * g).bool()  # same video except the positive: self and duplicates
    logits = logits.masked_fill(own, float("-inf"))
    loss = F.cross_entropy(logits, pos_col)
    with torch.no_grad():
        pos = logits[rows, pos_col]
        rank = 1.0 + (logits > pos[:, None]).sum(1).float()
    return loss, {"rank_pos": rank.mean(), "rank_intra_neg": torch.tensor(float("nan"))}


def momentum_loss(
    q: torch.Tensor, keys: torch.Tensor, key_roles: Sequence[str], *, keys_global: torch.Tensor | None = None,
    offset: int = 0, queue: torch.Tensor | None = None, queue_video: torch.Tensor | None = None, tau: float,
    hard_beta: float = 0.0, hard_alpha: float = 1.0, video: torch.Tensor | None = None,
    video_global: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MoCo's InfoNCE with MoQuad's negatives: online queries ``q`` (B, D) (the anchors, with grad) against the
    momentum encoder's keys ``keys`` (B, W, D) of the same videos' other views (``key_roles``: one ``positive``,
    any ``intra_negative``), the keys of every OTHER video of the global batch (``keys_global`` (G, W, D), all W
    views) and the ``queue`` (K, D) of earlier keys, whose ``queue_video`` (K,) holds each key's video (-1: an
    empty slot; both are masked, as is the anchor's own video; a queue without video ids is an error). Eq. 4
    (``hard_beta > 0``) mines the top ``hard_beta`` share of each anchor's unmasked negatives of batch and queue
    together and weights the intra negatives alpha."""
    if q.dim() != 2 or keys.dim() != 3 or keys.shape[:1] != q.shape[:1] or keys.shape[1] != len(key_roles):
        raise ValueError(f"need queries (B, D) and keys (B, {len(key_roles)}, D), got {tuple(q.shape)}, "
                         f"{tuple(keys.shape)}")
    pos, intra = role_views(("anchor", *key_roles))
    qn = F.normalize(q.float(), dim=-1)
    kl, kg = _prep(keys, keys_global, offset)
    b, g, w = qn.shape[0], kg.shape[0], kg.shape[1]
    s_pos = (qn * kl[:, pos - 1]).sum(-1)
    s_intra = torch.einsum("bd,bkd->bk", qn, kl[:, [i - 1 for i in intra]]) if intra else qn.new_zeros(b, 0)
    own = same_video(b, g, offset, video, video_global, qn.device)
    s_batch = (qn @ kg.reshape(g * w, -1).T).reshape(b, g, w).masked_fill(own[:, :, None], float("-inf"))
    parts = [s_batch.reshape(b, g * w)]
    if queue is not None and queue.shape[0]:
        if video is None or queue_video is None:
            raise ValueError(NO_VIDEO_IDS)
        qv = queue_video.to(qn.device)
        masked = (qv[None, :] < 0) | (qv[None, :] == video.to(qn.device)[:, None])
        parts.append((qn @ F.normalize(queue.float(), dim=-1).T).masked_fill(masked, float("-inf")))
    s_inter = torch.cat(parts, dim=1)
    return _contrast(s_pos, s_intra, s_inter, hard_k_per_anchor(s_inter, hard_beta), tau, hard_alpha)


@dataclass
class Projections:
    """What a method's loss sees of one step (:func:`moquad.train.loop.forward_loss` fills it).

    ``z`` (B, V, D): the online network's projections of the views it saw, ``roles`` theirs; under DDP
    ``z_global`` (G, V, D) gathered with gradients, ``offset`` this rank's first global row; ``video`` /
    ``video_global`` the manifest indices (same-video masking). A method with a momentum encoder
    (:mod:`moquad.train.momentum`) also gets ``keys`` (B, W, D) of the views with ``key_roles`` (no gradient),
    ``keys_global`` and the ``queue`` / ``queue_video`` of earlier keys (None: no queue)."""

    z: torch.Tensor
    roles: tuple[str, ...]
    z_global: torch.Tensor | None = None
    offset: int = 0
    video: torch.Tensor | None = None
    video_global: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    key_roles: tuple[str, ...] = ()
    keys_global: torch.Tensor | None = None
    queue: torch.Tensor | None = None
    queue_video: torch.Tensor | None = None

    def masks(self) -> dict:
        return {"z_global": self.z_global, "offset": self.offset, "video": self.video, "video_global": self.video_global}


# the step losses a method's stage names: (Projections, **its params) -> (loss, Fig. 4 ranks); the stage's ``params``
# (moquad.train.methods.Stage) reads them from the config: ``tau`` and, where Eq. 4 mines, ``hard_beta, hard_alpha``
def quadruple(p: Projections, *, tau: float, hard_beta: float, hard_alpha: float):
    """Eq. 1 / Eq. 4 over the views' roles (MoQuad, and the SimCLR base of the ladder)."""
    return moquad_loss(p.z, p.roles, tau=tau, hard_beta=hard_beta, hard_alpha=hard_alpha, **p.masks())


def speed_pair(p: Projections, *, tau: float):
    """Eq. 3, the appearance warm-up task (no mining)."""
    return appearance_loss(p.z, tau=tau, **p.masks())


def nt_xent(p: Projections, *, tau: float):
    """Classic SimCLR's symmetric NT-Xent."""
    return nt_xent_loss(p.z, tau=tau, **p.masks())


# a query's positive key under a symmetric routing (moquad.train.methods.Momentum): each of the pair queries the other
PARTNER = {"anchor": "positive", "positive": "anchor"}


def momentum_contrast(p: Projections, *, tau: float, hard_beta: float, hard_alpha: float):
    """:func:`momentum_loss` of each online view (``p.roles``: the anchor, and under a symmetric routing the
    positive too) against the keys, batch and queue, Eq. 4 mining; the mean over the queries (MoCo v3's symmetric
    loss when there are two). A query's positive is its :data:`PARTNER`'s key; the key of its own view (the same
    clip) is no candidate, for its video nor for the others (MoCo v3: ``ctr(q1, k2)`` ranks ``k2`` keys only)."""
    out = []
    for j, role in enumerate(p.roles):
        keep = [i for i, r in enumerate(p.key_roles) if r != role]
        roles = tuple("positive" if p.key_roles[i] == PARTNER[role] else p.key_roles[i] for i in keep)
        whole = len(keep) == len(p.key_roles)
        out.append(momentum_loss(
            p.z[:, j], p.keys if whole else p.keys[:, keep], roles,
            keys_global=p.keys_global if whole or p.keys_global is None else p.keys_global[:, keep], offset=p.offset,
            queue=p.queue, queue_video=p.queue_video, tau=tau, hard_beta=hard_beta, hard_alpha=hard_alpha,
            video=p.video, video_global=p.video_global))
    if len(out) == 1:
        return out[0]
    return torch.stack([loss for loss, _ in out]).mean(), out[0][1]  # the ranks: the anchor's queries (Fig. 4)


def momentum_plain(p: Projections, *, tau: float):
    """:func:`momentum_loss` without mining (Eq. 1 weights): the MoCo base, and the warm-up task on it."""
    return momentum_contrast(p, tau=tau, hard_beta=0.0, hard_alpha=1.0)
