"""The CPU path of apply_views (numpy gather, OpenCV colour map and flip) against a FROZEN copy of the torch-only
implementation it replaced (moquad/data/augment.py at 482fc2a) and against a float64 reference of the formula.

The stated change: step 1 (crop, resize, flip) and step 3 (the blend) are the same bits as before; step 2 (the
colour map) is OpenCV's float32 multiply-add instead of torch's 1 x 1 convolution, so a float32 result differs by
float rounding only and a uint8 view moves by 1 grey level where the value sat within rounding of a .5 boundary
(a few values per million). The uint8 views stay correctly rounded: within 0.5 + 1e-3 of the float64 reference.

A second stated change: the RAD mosaic ``D`` (ops.rad_mosaic) is resized by torch's uint8 kernel on the CPU
instead of the float one (~7x faster): D within 1 grey level of the float mosaic (measured max 1.001, mean 0.30),
so a view moves by at most ``lam`` levels before rounding. The tests above take D from ops.rad_mosaic as it is
now; the last two bound it against the float mosaic (:func:`_frozen_rad_mosaic`).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from moquad.config import LoaderConfig
from moquad.data import ops
from moquad.data.augment import apply_views, colour_matrices
from moquad.data.ops import APPEARANCE_OPS, rad_mosaic
from moquad.data.views import draw_colour, random_crop_box

# ----------------------------------------------------------------------------- frozen: augment.py at 482fc2a


def _frozen_crop_resize(frames, index, box, flip, size):
    top, left, h, w = box
    x = frames[index, top : top + h, left : left + w].permute(0, 3, 1, 2)
    if x.device.type != "cpu" or x.dtype != torch.uint8:
        x = x.float()
    if (h, w) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    if flip:
        x = x.flip(-1)
    return x.permute(0, 2, 3, 1)


def _frozen_crops(batch, size):
    raw, index = batch["raw"], batch["frame_index"]
    b, v, t = index.shape
    boxes, flips = batch["box"].tolist(), batch["flip"].tolist()
    y = torch.empty((b * v, t, size, size, 3), dtype=torch.uint8)
    for i in range(b):
        for j in range(v):
            y[i * v + j] = _frozen_crop_resize(raw[i], index[i, j], boxes[i][j], flips[i][j], size)
    return y


def _frozen_maps(y, codes, factors, sel):
    mean = y[torch.tensor(sel), ::4, ::8, ::8].reshape(len(sel), -1, 3).float().mean(1)
    return colour_matrices(codes[sel], factors[sel], mean)


def _frozen_apply_views(batch, size, quantize=False):
    b, v, t = batch["frame_index"].shape
    n = b * v
    y = _frozen_crops(batch, size)
    codes, factors = batch["colour_ops"].reshape(n, -1), batch["colour_factors"].reshape(n, -1)
    lam = batch["lam"].reshape(n).tolist()
    coloured = [i for i in range(n) if bool(codes[i].any())]
    maps = dict(zip(coloured, _frozen_maps(y, codes, factors, coloured))) if coloured else {}
    op, cache, o = APPEARANCE_OPS[batch["appearance_op"]], {}, 0.5 if quantize else 0.0
    out = torch.empty(y.shape, dtype=torch.uint8 if quantize else torch.float32)
    for i in range(n):
        x, offset = y[i], 0.0
        if i in maps:
            mb = maps[i]
            x = F.conv2d(x.permute(0, 3, 1, 2).float(), mb[:, :3, None, None], mb[:, 3] + o).permute(0, 2, 3, 1)
            x, offset = x.clamp_(o, 255 + o), o
        if lam[i] > 0:
            d = op.noise(batch, i, x, offset, cache)
            x = torch.add(d * lam[i] + (o - offset * (1 - lam[i])), x.float(), alpha=1 - lam[i])
            offset = o
        if x.dtype != torch.uint8 and offset != o:
            x = x.float() + o
        if quantize and x.dtype != torch.uint8:
            np.copyto(out[i].numpy(), x.contiguous().numpy(), casting="unsafe")
        else:
            out[i] = x
    return out.view(b, v, t, size, size, 3)


# ----------------------------------------------------------------------------- batches


def _batch(seed: int, op: str, size: int = 24, colour: bool = True, hw: tuple[int, int] = (40, 52)) -> dict:
    """Two videos x 4 views: boxes from 0.1 to 1 of the frame (up- and downscales, one box exactly size x size),
    random flips, SimCLR colour jitter + grayscale, half the views disturbed by ``op`` (lam 0.1..0.6)."""
    rng = np.random.default_rng(seed)
    b, v, t, u, k, c = 2, 4, 5, 9, 3, 11  # RAD: 3 x 3 windows of 11 px, a 33-px mosaic resized to size
    h, w = hw
    ramp = np.linspace(0, 255, w)[None, :, None] * np.linspace(0.3, 1, h)[:, None, None]
    frames = np.clip(ramp + rng.normal(0, 40, (b, u, h, w, 3)), 0, 255).astype(np.uint8)  # smooth + texture
    boxes = [[random_crop_box(h, w, (0.1, 1.0), rng) for _ in range(v)] for _ in range(b)]
    boxes[0][0] = (3, 5, size, size)  # no resize
    cfg = LoaderConfig(color_jitter=1.0 if colour else 0.0, grayscale=0.3 if colour else 0.0)
    drawn = [draw_colour(cfg, rng) for _ in range(b * v)]
    lam = np.where(np.arange(b * v) % 2 == 1, rng.uniform(0.1, 0.6, b * v), 0.0) if op != "none" else np.zeros(b * v)
    return {"raw": torch.from_numpy(frames), "frame_index": torch.from_numpy(rng.integers(0, u, (b, v, t))),
            "box": torch.tensor(boxes), "flip": torch.from_numpy(rng.random((b, v)) < 0.5),
            "colour_ops": torch.tensor([d[0] for d in drawn]).view(b, v, -1),
            "colour_factors": torch.tensor([d[1] for d in drawn], dtype=torch.float32).view(b, v, -1),
            "lam": torch.from_numpy(lam.astype(np.float32)).view(b, v), "appearance_op": op,
            "cells": torch.from_numpy(rng.integers(0, 7, (b, v, k * k))), "noise_frame": torch.from_numpy(
                rng.integers(0, t, (b, v))), "pool": torch.from_numpy(rng.integers(0, 256, (7, c, c, 3), dtype=np.uint8))}


def _reference(batch: dict, size: int) -> torch.Tensor:
    """The documented formula in float64 from the frozen uint8 crops: clamp(M x + b, 0, 255), then
    (1 - lam) V + lam D with D the RAD mosaic (ops.rad_mosaic) or frame j of V (BE)."""
    b, v, t = batch["frame_index"].shape
    n = b * v
    y = _frozen_crops(batch, size).double()
    codes, factors = batch["colour_ops"].reshape(n, -1), batch["colour_factors"].reshape(n, -1)
    lam = batch["lam"].reshape(n).double()
    out = y.clone()
    for i in range(n):
        if bool(codes[i].any()):
            mb = _frozen_maps(y.to(torch.uint8), codes, factors, [i])[0].double()
            out[i] = (y[i] @ mb[:, :3].T + mb[:, 3]).clamp(0, 255)
        if lam[i] > 0:
            if batch["appearance_op"] == "be":
                d = out[i, int(batch["noise_frame"].reshape(-1)[i])].clone()
            else:
                d = rad_mosaic(batch["pool"][batch["cells"].reshape(n, -1)[i]][None], size)[0].double()
            out[i] = (1 - lam[i]) * out[i] + lam[i] * d
    return out.view(b, v, t, size, size, 3)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("op", ["rad_inter", "be", "none"])
def test_against_the_frozen_torch_implementation(op):
    """float32: float rounding only; uint8: at most 1 level, on a few values per million (step 2's rounding)."""
    diffs, total = 0, 0
    for seed in range(4):
        batch = _batch(seed, op)
        new, old = apply_views(batch, 24), _frozen_apply_views(batch, 24)
        assert new.dtype == torch.float32 and new.shape == old.shape == (2, 4, 5, 24, 24, 3)
        assert float((new - old).abs().max()) < 2e-3
        new8, old8 = apply_views(batch, 24, quantize=True), _frozen_apply_views(batch, 24, quantize=True)
        d = (new8.int() - old8.int()).abs()
        assert new8.dtype == torch.uint8 and int(d.max()) <= 1
        diffs, total = diffs + int((d > 0).sum()), total + d.numel()
    assert diffs / total < 1e-4, (diffs, total)
    assert cv2.getNumThreads() == torch.get_num_threads()  # OpenCV follows torch's thread count


@pytest.mark.parametrize("op", ["rad_inter", "be"])
def test_without_colour_the_same_bits_as_before(op):
    """Steps 1 and 3 are unchanged: crop / resize / flip (numpy gather, OpenCV flip) and the blend, bit for bit."""
    for seed in range(4):
        batch = _batch(seed, op, colour=False)
        assert not bool(batch["colour_ops"].any()) and bool((batch["lam"] > 0).any())
        for quantize in (False, True):
            assert torch.equal(apply_views(batch, 24, quantize=quantize), _frozen_apply_views(batch, 24, quantize))


@pytest.mark.parametrize("op", ["rad_inter", "be", "none"])
def test_uint8_views_are_the_correctly_rounded_formula(op):
    """Against float64: |uint8 - reference| <= 0.5 (+ float32 noise) everywhere; off-by-one only at near-ties."""
    for seed in range(4):
        batch = _batch(seed, op)
        ref = _reference(batch, 24)
        got = apply_views(batch, 24, quantize=True).double()
        assert float((got - ref).abs().max()) <= 0.5 + 1e-3
        assert float((got - (ref + 0.5).floor()).abs().mean()) < 1e-3
        assert float((apply_views(batch, 24) - ref).abs().max()) < 1e-3  # the float path: the formula itself


@pytest.mark.parametrize("side", [7, 13, 24])
def test_identical_frames_stay_identical_at_any_size(side):
    """cv2.transform's scalar tail rounds differently from its SIMD body: the clip is padded so no real pixel
    takes it (without the padding the last frame's last pixels differed in float32)."""
    batch = _batch(0, "rad_inter", size=side)
    batch["raw"][:] = batch["raw"][:, :1]  # every frame of a video the same
    for quantize in (False, True):
        out = apply_views(batch, side, quantize=quantize)
        assert torch.equal(out, out[:, :, :1].expand_as(out))


# ----------------------------------------------------------------------------- the uint8 RAD mosaic


def _frozen_rad_mosaic(cells, size):
    """ops.rad_mosaic before the uint8 mosaic: float32, channel-planar, torch's float antialiased resize."""
    kk, c = cells.shape[-4], cells.shape[-3]
    k = math.isqrt(kk)
    x = cells.reshape(-1, k, k, c, c, 3).permute(0, 5, 1, 3, 2, 4).reshape(-1, 3, k * c, k * c).float()
    if k * c != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.permute(0, 2, 3, 1)


@pytest.mark.parametrize("k, c, size", [(5, 23, 112), (3, 11, 24), (2, 40, 112), (5, 23, 100), (3, 11, 33)])
def test_uint8_rad_mosaic_within_one_level_of_the_float_mosaic(k, c, size):
    """Down- and upscaled mosaics of noise windows (the worst case) within 1.01 levels of the float mosaic, mean
    <= 0.32; a mosaic that needs no resize (3 x 11 = 33) is the windows themselves, as before."""
    cells = torch.from_numpy(np.random.default_rng(k * c).integers(0, 256, (6, k * k, c, c, 3), dtype=np.uint8))
    new, old = rad_mosaic(cells, size), _frozen_rad_mosaic(cells, size)
    assert new.dtype == torch.uint8 and new.is_contiguous() and new.shape == old.shape == (6, size, size, 3)
    d = (new.float() - old).abs()
    if k * c == size:
        assert float(d.max()) == 0
    else:
        assert float(d.max()) <= 1.01 and float(d.mean()) <= 0.32, (float(d.max()), float(d.mean()))


def test_rad_views_move_at_most_lam_levels(monkeypatch):
    """Whole views, RAD on, colour on: the float views within lam * 1.01 levels of those with the float mosaic,
    the uint8 views within 1 level."""
    for seed in range(4):
        batch = _batch(seed, "rad_inter")
        new, new8 = apply_views(batch, 24), apply_views(batch, 24, quantize=True)
        with monkeypatch.context() as m:
            m.setattr(ops, "rad_mosaic", _frozen_rad_mosaic)
            old, old8 = apply_views(batch, 24), apply_views(batch, 24, quantize=True)
        lam = batch["lam"].view(2, 4, 1, 1, 1, 1)
        assert bool(((new - old).abs() <= lam * 1.01 + 1e-3).all())
        assert int((new8.int() - old8.int()).abs().max()) <= 1
        assert bool((new - old).abs().amax(dim=(2, 3, 4, 5))[lam.view(2, 4) > 0].gt(0).all())  # the mosaic did change
