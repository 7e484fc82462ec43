"""The ops of a MoQuad quadruple: ONE table per kind, each op ONE object that draws and applies itself.

- :data:`MOTION_OPS` (``LoaderConfig.motion_ops``): how an Intra-Neg's frames are chosen. Each listed op makes
  its own Intra-Neg and AD-Intra-Neg (the first op's views are named ``intra_neg`` / ``ad_intra_neg``, the
  others ``intra_neg:OP`` / ``ad_intra_neg:OP``), so ``("speed", "reverse")`` gives six views per video.
- :data:`APPEARANCE_OPS` (``LoaderConfig.appearance_op``): the appearance disturbance of AD-Pos and the
  AD-Intra-Negs, ``(1 - lam) * V + lam * D`` with the SAME noise image ``D`` on every frame (temporal
  differences, i.e. motion, are only scaled by ``1 - lam``).
- :data:`FLIP_POLICIES` (``LoaderConfig.flip``): which views of one video share a horizontal flip.

Adding an op is one entry here (plus its tests): the config's choices, ``views.draw_views`` (parameters),
``pipeline`` (what the op needs read: donor frames, the video's own frames) and ``augment.apply_views``
(pixels) read these tables. torch is imported inside the pixel functions only, so ``moquad.config`` (which
reads the names) stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moquad.data.clip_frames import random_clip

# ----------------------------------------------------------------------------- motion


@dataclass(frozen=True)
class MotionOp:
    """Makes an Intra-Neg's frame indices: ``frames(num_frames, T, dilation, rng)``.

    ``second_speed``: the op plays the video at a dilation ``m != n`` (the anchor's ``n``); it is called with
    ``m``. Otherwise it keeps the anchor's speed ``n`` and changes the frame ORDER. When a video is too short
    for two dilations, a ``second_speed`` op falls back to ``reverse`` (:mod:`moquad.data.clip_frames`).
    """

    help: str
    second_speed: bool
    frames: Callable[[int, int, int, np.random.Generator], np.ndarray]


def _speed(num_frames: int, t: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return random_clip(num_frames, t, d, rng)


def _reverse(num_frames: int, t: int, d: int, rng: np.random.Generator) -> np.ndarray:
    return random_clip(num_frames, t, d, rng)[::-1].copy()


def _shuffle(num_frames: int, t: int, d: int, rng: np.random.Generator) -> np.ndarray:
    idx = random_clip(num_frames, t, d, rng)
    if t < 2:
        return idx
    perm = rng.permutation(t)
    while np.array_equal(perm, np.arange(t)):
        perm = rng.permutation(t)
    return idx[perm]


def _periodic(num_frames: int, t: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Forward then backward (RTT's periodic): ``t // 2 + 1`` frames forward, the rest retracing them."""
    half = random_clip(num_frames, t // 2 + 1, d, rng)
    return np.concatenate([half, half[-2::-1]])[:t].copy()


MOTION_OPS: dict[str, MotionOp] = {
    "speed": MotionOp("the same video at another dilation m != n (the paper's default)", True, _speed),
    "reverse": MotionOp("a clip at n played backwards (arrow of time)", False, _reverse),
    "shuffle": MotionOp("a clip at n with its frames in a random order (never the identity)", False, _shuffle),
    "periodic": MotionOp("forward then back over the same frames at n (RTT's periodic)", False, _periodic),
}

# ----------------------------------------------------------------------------- appearance


@dataclass
class Disturbed:
    """What an appearance op draws for one view: ``lam`` and where its noise image comes from."""

    lam: float
    cells: np.ndarray | None = None  # (k*k,) indices into the batch's donor pool (RAD-inter)
    own_cells: np.ndarray | None = None  # (k*k,) positions into the video's decoded frames (RAD-intra)
    noise_frame: int = -1  # BE: position in the clip of the frame used as D
    donor_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class AppearanceOp:
    """One appearance disturbance.

    ``source`` says what the loader must read for it: ``donors`` (one frame of random OTHER videos, a pool per
    batch), ``own`` (the video's own frames, into the same pool) or ``clip`` / ``""`` (nothing more).
    ``draw(ctx, rng)`` -> :class:`Disturbed` for one view; ``noise(batch, i, x, offset, cache)`` -> ``D`` float32
    (size, size, 3) in 0..255 for flat view ``i`` of the batch, ``x`` its clip after the colour map carrying
    ``offset``; ``cache`` lets an op do batch-wide work once (the RAD mosaics).
    """

    help: str
    source: str
    draw: Callable[[dict[str, Any], np.random.Generator], Disturbed | None]
    noise: Callable[..., Any] | None


def _lam(ctx: dict[str, Any], rng: np.random.Generator) -> float:
    lo, hi = ctx["rad_lambda"]
    return float(rng.uniform(lo, hi))


def _draw_rad_inter(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    cells, ids = ctx["pick"](ctx["kk"], rng)
    return Disturbed(lam, cells=cells, donor_ids=tuple(ids))


def _draw_rad_intra(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    return Disturbed(lam, own_cells=rng.integers(0, ctx["num_decoded"], size=ctx["kk"]),
                     donor_ids=(ctx["video_id"],) * ctx["kk"])


def _draw_be(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    return Disturbed(lam, noise_frame=int(rng.integers(0, ctx["frames"])), donor_ids=(ctx["video_id"],))


def rad_mosaic(cells: Any, size: int) -> Any:
    """RAD noise images: uint8 windows (N, k*k, c, c, 3), row-major -> float32 (N, size, size, 3)."""
    import torch.nn.functional as F

    kk, c = cells.shape[-4], cells.shape[-3]
    k = math.isqrt(kk)
    x = cells.reshape(-1, k, k, c, c, 3).permute(0, 5, 1, 3, 2, 4).reshape(-1, 3, k * c, k * c).float()
    if k * c != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.permute(0, 2, 3, 1)


def _noise_rad(batch: dict, i: int, x: Any, offset: float, cache: dict) -> Any:
    """The view's mosaic; all disturbed views' mosaics are made in one call the first time."""
    if "mosaics" not in cache:
        lam = batch["lam"].reshape(-1)
        hits = [j for j, v in enumerate(lam.tolist()) if v > 0]
        cells = batch["cells"].reshape(len(lam), -1)[hits].to(batch["pool"].device)
        cache["mosaics"] = dict(zip(hits, rad_mosaic(batch["pool"][cells], x.shape[1])))
    return cache["mosaics"][i]


def _noise_be(batch: dict, i: int, x: Any, offset: float, cache: dict) -> Any:
    return x[int(batch["noise_frame"].reshape(-1)[i])].float() - offset


APPEARANCE_OPS: dict[str, AppearanceOp] = {
    "rad_inter": AppearanceOp("RAD: a k x k mosaic of frames of OTHER videos (the paper's default)", "donors",
                              _draw_rad_inter, _noise_rad),
    "rad_intra": AppearanceOp("RAD with the mosaic's frames from the same video", "own", _draw_rad_intra, _noise_rad),
    "be": AppearanceOp("Background Erasing: one frame of the clip itself", "clip", _draw_be, _noise_be),
    "none": AppearanceOp("no appearance disturbance", "", lambda ctx, rng: None, None),
}

# ----------------------------------------------------------------------------- flips

FLIP_POLICIES: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    # each view flipped on its own coin: teaches flip invariance (left and right motion become one)
    "independent": lambda views, rng: rng.random(views) < 0.5,
    # one coin per video: every view of the quadruple flipped together (no left = right lesson)
    "shared": lambda views, rng: np.full(views, rng.random() < 0.5),
    # never flipped (left/right-sensitive data, e.g. SSv2)
    "none": lambda views, rng: np.zeros(views, bool),
}
