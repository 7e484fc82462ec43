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
(pixels) read these tables. An appearance op declares its own per-view parameters in its row
(:class:`OpParam`: name, shape, dtype, fill); ``ViewParams``, the batches and ``apply_views`` carry them by
those names without knowing them (tests/test_ops.py adds an op that way). torch is imported inside the pixel
functions only, so ``moquad.config`` (which reads the names) stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
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


# A batch's keys besides the appearance op's own parameters (moquad.data.pipeline, both paths; tests/test_ops.py
# checks a real batch has no other): a parameter by one of these names would silently overwrite the batch's value.
BATCH_KEYS = frozenset({"raw", "views", "frame_index", "box", "flip", "colour_ops", "colour_factors", "lam", "pool",
                        "appearance_op", "view_names", "roles", "video_id", "index", "label", "bad", "bytes", "info"})


@dataclass(frozen=True)
class OpParam:
    """A per-view parameter of an appearance op: :class:`~moquad.data.views.ViewParams` holds it (V, *shape) and
    the batch (B, V, *shape) under its name, ``fill`` in the views the op leaves alone."""

    shape: tuple[int | str, ...]  # per view; a str names a size of the draw context (``kk``: the k*k RAD windows)
    dtype: str
    fill: int | float
    pool: bool = False  # windows of the batch's ``pool``, by index (AppearanceOp: how the loader fills them)


@dataclass
class Disturbed:
    """What an appearance op draws for one view: ``lam``, the values of its parameters (``AppearanceOp.params``, by
    name) and the videos its noise image shows (per-video ``info``)."""

    lam: float
    params: dict[str, Any] = field(default_factory=dict)
    donor_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class AppearanceOp:
    """One appearance disturbance: its row is all the loader and ``apply_views`` know of it.

    ``params``: its per-view parameters (:class:`OpParam`) by name; ``draw(ctx, rng)`` -> :class:`Disturbed` for one
    disturbed view (``ctx``: ``rad_lambda``, ``kk``, ``frames`` (T), ``num_decoded`` (U), ``video_id``, ``pick``);
    ``noise(batch, i, x, offset, cache)`` -> ``D`` (size, size, 3) in 0..255 for flat view ``i``, reading its
    parameters from the batch by the same names; ``x`` is the clip after the colour map, carrying ``offset``;
    ``cache`` lets an op do batch-wide work once (the RAD mosaics).
    ``source`` says what the loader must read for it: ``donors`` (one frame of random OTHER videos, a pool per
    batch: its ``pool`` parameters are drawn as indices into it by ``ctx["pick"]``), ``own`` (the video's own
    frames: its ``pool`` parameters are drawn as positions into the decoded frames, ``ViewParams.frames``; the
    loader resizes those frames into the pool and replaces the positions by their indices there) or ``clip`` /
    ``""`` (nothing more). The pool is uint8 (P, c, c, 3), ``c`` the RAD window size.
    """

    help: str
    source: str
    draw: Callable[[dict[str, Any], np.random.Generator], Disturbed | None]
    noise: Callable[..., Any] | None
    params: dict[str, OpParam] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = sorted(set(self.params) & BATCH_KEYS)
        if clash:
            raise ValueError(f"appearance op parameter {clash[0]!r} is named like a batch key and would overwrite it; "
                             f"rename it (batch keys: {', '.join(sorted(BATCH_KEYS))})")

    @property
    def pool_params(self) -> tuple[str, ...]:
        return tuple(name for name, p in self.params.items() if p.pool)


def _lam(ctx: dict[str, Any], rng: np.random.Generator) -> float:
    lo, hi = ctx["rad_lambda"]
    return float(rng.uniform(lo, hi))


def _draw_rad_inter(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    cells, ids = ctx["pick"](ctx["kk"], rng)
    return Disturbed(lam, {"cells": cells}, tuple(ids))


def _draw_rad_intra(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    positions = rng.integers(0, ctx["num_decoded"], size=ctx["kk"])  # into the decoded frames: the loader maps them
    return Disturbed(lam, {"cells": positions}, (ctx["video_id"],) * ctx["kk"])


def _draw_be(ctx: dict[str, Any], rng: np.random.Generator) -> Disturbed:
    lam = _lam(ctx, rng)
    return Disturbed(lam, {"noise_frame": int(rng.integers(0, ctx["frames"]))}, (ctx["video_id"],))


def rad_mosaic(cells: Any, size: int) -> Any:
    """RAD noise images: uint8 windows (N, k*k, c, c, 3), row-major -> (N, size, size, 3) channels-last.

    On the CPU the mosaic stays uint8 and torch's antialiased uint8 kernel resizes it (~7x the float kernel; ``D``
    within 1 grey level of the float resize, so a view within ``lam`` levels: tests/test_augment_uint8.py); on
    other devices it is float32 (channel-planar memory)."""
    import torch.nn.functional as F

    kk, c = cells.shape[-4], cells.shape[-3]
    k = math.isqrt(kk)
    if cells.device.type != "cpu":
        x = cells.reshape(-1, k, k, c, c, 3).permute(0, 5, 1, 3, 2, 4).reshape(-1, 3, k * c, k * c).float()
    else:  # contiguous (N, kc, kc, 3) seen as (N, 3, kc, kc): the channels-last layout the uint8 kernel wants
        x = cells.reshape(-1, k, k, c, c, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, k * c, k * c, 3).permute(0, 3, 1, 2)
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


_CELLS = {"cells": OpParam(("kk",), "int64", -1, pool=True)}  # the k*k RAD windows, row-major

APPEARANCE_OPS: dict[str, AppearanceOp] = {
    "rad_inter": AppearanceOp("RAD: a k x k mosaic of frames of OTHER videos (the paper's default)", "donors",
                              _draw_rad_inter, _noise_rad, _CELLS),
    "rad_intra": AppearanceOp("RAD with the mosaic's frames from the same video", "own", _draw_rad_intra, _noise_rad,
                              _CELLS),
    "be": AppearanceOp("Background Erasing: one frame of the clip itself", "clip", _draw_be, _noise_be,
                       {"noise_frame": OpParam((), "int64", -1)}),  # the clip frame (position in the clip) used as D
    "none": AppearanceOp("no appearance disturbance", "", lambda ctx, rng: None, None),
}

# ----------------------------------------------------------------------------- flips

def _flip_independent(views: int, rng: np.random.Generator) -> np.ndarray:
    """Each view flipped on its own coin: teaches flip invariance (left and right motion become one)."""
    return rng.random(views) < 0.5


def _flip_shared(views: int, rng: np.random.Generator) -> np.ndarray:
    """One coin per video: every view of the quadruple flipped together (no left = right lesson)."""
    return np.full(views, rng.random() < 0.5)


def _flip_none(views: int, rng: np.random.Generator) -> np.ndarray:
    """Never flipped (left/right-sensitive data, e.g. SSv2)."""
    return np.zeros(views, bool)


FLIP_POLICIES: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "independent": _flip_independent,
    "shared": _flip_shared,
    "none": _flip_none,
}
