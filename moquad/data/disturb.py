"""Appearance and motion disturbances of the MoQuad quadruple (paper Sec. 3.1).

Appearance (``LoaderConfig.appearance_op``), applied to AD-Pos and AD-Intra-Neg:
  - ``rad_inter`` (default): RAD. A noise image ``D`` is a k x k grid of windows (k=5), each filled
    with a frame of ANOTHER video (from the cross-shard donor pool, :mod:`moquad.data.donors`)
    resized to the window; the clip becomes ``(1 - lam) * V + lam * D`` with ``lam ~ U[0.1, 0.5]``
    and the SAME ``D`` on every frame, so temporal differences (motion) are only scaled by
    ``1 - lam``. Each disturbed clip gets its own ``D`` and ``lam``.
  - ``rad_intra``: the same, with the window frames drawn from the current video.
  - ``be``: Background Erasing: ``D`` is one frame of the clip itself.
  - ``none``: no appearance disturbance (``lam = 0``).

RAD is applied AFTER the clip's spatial augmentation, at the crop size: the disturbed clip is then
exactly ``(1 - lam) * aug(V) + lam * D`` (up to one uint8 rounding), i.e. subtracting
``(1 - lam)`` times the undisturbed augmented frames leaves the same image ``lam * D`` on every
frame -- a property the tests check. Applied before augmentation, colour jitter and clamping would
act on ``D`` too and the grid would be cropped/rescaled away from k x k.

The windows: donors are resized to ``c x c`` with ``c = ceil(size / k)``, tiled into a
``k*c`` square mosaic, and the mosaic is resized once to ``size`` (a no-op when ``k`` divides
``size``), so each window holds one whole donor frame resized to the (fractional) window size.

Motion (``LoaderConfig.motion_op``), applied to the Intra-Negs (see :mod:`moquad.data.sampling`):
  - ``speed`` (default): the Intra-Negs are clips at dilation ``m != n``.
  - ``reverse``: a clip at dilation ``n`` played backwards.
  - ``shuffle``: a clip at dilation ``n`` with its frames in a random order (never the identity).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

APPEARANCE_OPS = ("rad_inter", "rad_intra", "be", "none")
MOTION_OPS = ("speed", "reverse", "shuffle")


def check_ops(appearance_op: str, motion_op: str) -> None:
    """Raise a ValueError naming the valid choices for an unknown disturbance."""
    if appearance_op not in APPEARANCE_OPS:
        raise ValueError(f"unknown appearance_op {appearance_op!r}; choose one of {', '.join(APPEARANCE_OPS)}")
    if motion_op not in MOTION_OPS:
        raise ValueError(f"unknown motion_op {motion_op!r}; choose one of {', '.join(MOTION_OPS)}")


def cell_size(size: int, k: int) -> int:
    """Side of the square a donor frame is stored at for a ``k x k`` grid over ``size`` pixels."""
    if k < 1 or size < k:
        raise ValueError(f"rad_k must be between 1 and the crop size {size}, got {k}")
    return math.ceil(size / k)


def resize_donors(frames: torch.Tensor, cell: int) -> torch.Tensor:
    """uint8 frames (N, H, W, 3) -> uint8 (N, cell, cell, 3) (antialiased, aspect not kept)."""
    x = frames.permute(0, 3, 1, 2)
    x = F.interpolate(x, size=(cell, cell), mode="bilinear", antialias=True, align_corners=False)
    return x.permute(0, 2, 3, 1).contiguous()


def rad_noise(donors: torch.Tensor, k: int, size: int) -> torch.Tensor:
    """Noise image ``D``: float32 (size, size, 3) from ``k*k`` donors uint8 (k*k, c, c, 3), row-major."""
    n, c, c2, ch = donors.shape
    if n != k * k or ch != 3 or c != c2:
        raise ValueError(f"need {k * k} square donor frames (c, c, 3), got shape {tuple(donors.shape)}")
    mosaic = donors.reshape(k, k, c, c, 3).permute(0, 2, 1, 3, 4).reshape(k * c, k * c, 3)
    if k * c != size:
        x = mosaic.permute(2, 0, 1).unsqueeze(0)
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        mosaic = x[0].permute(1, 2, 0)
    return mosaic.float()


def draw_lambda(rng: np.random.Generator, lam_range: tuple[float, float]) -> float:
    """``lam ~ U[lo, hi]`` (paper: [0.1, 0.5])."""
    lo, hi = float(lam_range[0]), float(lam_range[1])
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"rad_lambda must satisfy 0 <= lo <= hi <= 1, got {lam_range}")
    return float(rng.uniform(lo, hi))


def blend(clip: torch.Tensor, noise: torch.Tensor, lam: float, offset: float = 0.0) -> torch.Tensor:
    """``(1 - lam) * clip + lam * noise (+ offset)`` on every frame, in place, in one pass.

    ``clip`` float (T, H, W, 3), ``noise`` (H, W, 3); ``offset=0.5`` pre-adds the rounding offset.
    """
    term = noise * lam + offset if offset else noise * lam
    return torch.add(term, clip, alpha=1.0 - lam, out=clip)


def be_noise(clip: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """BE's distracting image: one random frame (H, W, 3) of the (augmented) clip itself, as float."""
    return clip[int(rng.integers(0, clip.shape[0]))].to(torch.float32, copy=True)


def motion_indices(indices: np.ndarray, op: str, rng: np.random.Generator) -> np.ndarray:
    """Frame order of a motion-disturbed clip for ``reverse`` / ``shuffle`` (``speed``: unchanged)."""
    if op == "speed":
        return indices
    if op == "reverse":
        return indices[::-1].copy()
    if op == "shuffle":
        t = len(indices)
        if t < 2:
            return indices
        perm = rng.permutation(t)
        while np.array_equal(perm, np.arange(t)):
            perm = rng.permutation(t)
        return indices[perm]
    raise ValueError(f"unknown motion_op {op!r}; choose one of {', '.join(MOTION_OPS)}")
