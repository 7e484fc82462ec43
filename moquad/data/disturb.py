"""Appearance and motion disturbances of the MoQuad quadruple (paper Sec. 3.1).

Appearance (``LoaderConfig.appearance_op``), applied to AD-Pos and AD-Intra-Neg:
  - ``rad_inter`` (default): RAD. A noise image ``D`` is a k x k grid of windows (k=5), each filled
    with a frame of ANOTHER video (random other videos of the split, read by index, from other shards when there are several: :mod:`moquad.data.donors`)
    resized to the window; the clip becomes ``(1 - lam) * V + lam * D`` with ``lam ~ U[0.1, 0.5]``
    and the SAME ``D`` on every frame, so temporal differences (motion) are only scaled by
    ``1 - lam``. Each disturbed clip gets its own ``D`` and ``lam``.
  - ``rad_intra``: the same, with the window frames drawn from the current video.
  - ``be``: Background Erasing: ``D`` is one frame of the clip itself.
  - ``none``: no appearance disturbance (``lam = 0``).

This module holds the choices (ops, lambda, the motion-disturbed frame order); the pixels are made by
:func:`moquad.data.augment.apply_views`. RAD is applied AFTER the clip's spatial augmentation and colour
map, at the crop size: the disturbed clip is exactly ``(1 - lam) * aug(V) + lam * D``, i.e. subtracting
``(1 - lam)`` times the undisturbed augmented frames leaves the same image ``lam * D`` on every
frame -- a property the tests check. The windows: donors are resized to ``c x c`` with
``c = ceil(size / k)`` (:mod:`moquad.data.donors`), tiled into a ``k*c`` square mosaic, and the
mosaic is resized once to ``size`` (a no-op when ``k`` divides ``size``).

Motion (``LoaderConfig.motion_op``), applied to the Intra-Negs (see :mod:`moquad.data.sampling`):
  - ``speed`` (default): the Intra-Negs are clips at dilation ``m != n``.
  - ``reverse``: a clip at dilation ``n`` played backwards.
  - ``shuffle``: a clip at dilation ``n`` with its frames in a random order (never the identity).
"""

from __future__ import annotations

import numpy as np

MOTION_OPS = ("speed", "reverse", "shuffle")


def draw_lambda(rng: np.random.Generator, lam_range: tuple[float, float]) -> float:
    """``lam ~ U[lo, hi]`` (paper: [0.1, 0.5])."""
    lo, hi = float(lam_range[0]), float(lam_range[1])
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"rad_lambda must satisfy 0 <= lo <= hi <= 1, got {lam_range}")
    return float(rng.uniform(lo, hi))


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
