"""Contrastive losses of the paper, on L2-normalised projections with temperature tau.

- :func:`moquad_loss`: Eq. 1 (MoQuad quadruples), with Eq. 4 hard-negative mining when
  ``hard_beta > 0``.
- :func:`appearance_loss`: Eq. 3 (warm-up task: clip at dilation n vs clip at dilation m).
- :func:`nt_xent_loss`: SimCLR's NT-Xent for the baseline.

:data:`LOSSES` maps each loader mode to its loss (the trainer's one call).

Conventions shared by all three:

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
  least one so mining stays active on small batches); the K most similar inter negatives and
  the intra negatives get weight alpha. beta = 0 gives exactly Eq. 1 (intra weight 1).
- Each loss also returns the Fig. 4 diagnostic: the mean 1-based rank (1 = most similar) of
  the positive and of the intra negatives among each anchor's candidates
  (positive + intra negatives + inter negatives), as 0-d tensors (no host sync: the trainer reads
  them at log steps only). ``nan`` when a kind is absent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

POS_NAMES = ("ad_pos", "pos")  # the names moquad.data.views gives the positive view
INTRA_NAMES = ("intra_neg", "ad_intra_neg")


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

    k = hard_k((g - 1) * v, hard_beta)
    log_w_inter = torch.zeros_like(s_inter)
    log_w_intra = 0.0
    if k > 0:
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
        stats["rank_intra_neg"] = _ranks(s_intra, cands).mean() if intra_idx else torch.tensor(float("nan"))
    return loss, stats


def view_roles(view_names: Sequence[str]) -> tuple[int, list[int]]:
    """(positive view index, intra-negative view indices) from the loader's ``view_names``."""
    names = list(view_names)
    if not names or names[0] != "anchor":
        raise ValueError(f"the first view must be 'anchor', got view_names={names}")
    pos = [i for i, n in enumerate(names) if n in POS_NAMES]
    if len(pos) != 1:
        raise ValueError(f"need exactly one positive view ({'/'.join(POS_NAMES)}) in {names}")
    intra = [i for i, n in enumerate(names) if n.split(":")[0] in INTRA_NAMES]  # "intra_neg:OP": more motion ops
    unknown = [n for i, n in enumerate(names) if i > 0 and i not in intra and n not in POS_NAMES]
    if unknown:
        raise ValueError(f"unknown view names {unknown} in {names}")
    return pos[0], intra


def moquad_loss(
    z_local: torch.Tensor,
    view_names: Sequence[str] = ("anchor", "ad_pos", "intra_neg", "ad_intra_neg"),
    *,
    z_global: torch.Tensor | None = None,
    offset: int = 0,
    tau: float = 0.1,
    hard_beta: float = 0.01,
    hard_alpha: float = 1.5,
    video: torch.Tensor | None = None,
    video_global: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 1 (``hard_beta=0``) / Eq. 4 on quadruples ``z_local`` (B, V, D) in ``view_names`` order.

    Ablations that drop views simply pass fewer views (e.g. ``("anchor", "ad_pos")``: the SimCLR base).
    """
    if z_local.dim() != 3 or z_local.shape[1] != len(view_names):
        raise ValueError(f"z_local must be (B, {len(view_names)}, D), got {tuple(z_local.shape)}")
    pos, intra = view_roles(view_names)
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


# the loss of each loader mode (moquad.data.views.MODES), one call for all: (z_local, view_names, hard_beta=,
# hard_alpha=, z_global=, offset=, tau=, video=, video_global=) -> (loss, Fig. 4 ranks); the quadruple (Eq. 1 / 4),
# the appearance warm-up (Eq. 3: two views, no mining) and classic SimCLR's pair (NT-Xent)
LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "moquad": lambda z, view_names, hard_beta, hard_alpha, **kw: moquad_loss(
        z, view_names, hard_beta=hard_beta, hard_alpha=hard_alpha, **kw),
    "appearance": lambda z, view_names, hard_beta, hard_alpha, **kw: appearance_loss(z, **kw),
    "pair": lambda z, view_names, hard_beta, hard_alpha, **kw: nt_xent_loss(z, **kw),
}
