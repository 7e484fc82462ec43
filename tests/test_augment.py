"""apply_views: one set of parameters per clip, checked against torchvision; colour maps; rounding; normalise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF

from moquad.config import LoaderConfig
from moquad.data.augment import MEAN, STD, apply_views, colour_matrices, normalize
from moquad.data.views import COLOUR_OPS, draw_colour, random_crop_box


def _textured(t: int = 6, h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)


def _batch(frames: np.ndarray, clips, colour=None, k: int = 5) -> dict:
    """One video's frames (U, H, W, 3) and clips [(frame indices, (top, left, h, w), flip)] as an apply_views batch."""
    v = len(clips)
    codes = torch.zeros(1, v, 5, dtype=torch.int64)
    factors = torch.zeros(1, v, 5)
    for j, ops in enumerate(colour or []):
        for i, (name, f) in enumerate(ops):
            codes[0, j, i], factors[0, j, i] = COLOUR_OPS.index(name), f
    return {
        "raw": torch.from_numpy(frames)[None], "frame_index": torch.tensor([[idx for idx, _, _ in clips]]),
        "box": torch.tensor([[box for _, box, _ in clips]]), "flip": torch.tensor([[fl for _, _, fl in clips]]),
        "colour_ops": codes, "colour_factors": factors, "lam": torch.zeros(1, v),
        "cells": torch.full((1, v, k * k), -1), "noise_frame": torch.full((1, v), -1),
        "pool": torch.zeros((0, 3, 3, 3), dtype=torch.uint8), "appearance_op": "none",
    }


@pytest.mark.parametrize("quantize", [True, False])
def test_crop_resize_flip_match_torchvision(quantize):
    frames = _textured()
    clips = [([0, 2, 5], (5, 9, 30, 41), True), ([1, 1, 3], (0, 0, 12, 10), False)]  # downscale / upscale
    out = apply_views(_batch(frames, clips), 24, quantize=quantize)[0]  # (V, T, 24, 24, 3)
    assert out.dtype == (torch.uint8 if quantize else torch.float32) and out.shape == (2, 3, 24, 24, 3)
    for v, (idx, (top, left, h, w), flip) in enumerate(clips):
        x = torch.from_numpy(frames[idx]).permute(0, 3, 1, 2)
        ref = TF.resized_crop(x, top, left, h, w, [24, 24], antialias=True)
        ref = (TF.horizontal_flip(ref) if flip else ref).permute(0, 2, 3, 1)
        assert (out[v].float() - ref.float()).abs().max() <= 1  # the CPU resize reads and writes uint8


def test_same_parameters_on_every_frame_and_frame_order_kept():
    frames = np.stack([_textured(1)[0]] * 5)
    cfg = LoaderConfig(size=32, color_jitter=1.0, grayscale=0.5)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        box = random_crop_box(48, 64, (0.3, 1.0), rng)
        ops = draw_colour(cfg, rng)
        batch = _batch(frames, [([0, 1, 2, 3, 4], box, bool(seed % 2))])
        batch["colour_ops"][0, 0], batch["colour_factors"][0, 0] = torch.tensor(ops[0]), torch.tensor(ops[1])
        out = apply_views(batch, 32)[0, 0]
        assert torch.equal(out[0:1].expand_as(out), out)  # identical input frames stay identical
    ramp = np.stack([np.full((40, 50, 3), 10 * i, dtype=np.uint8) for i in range(8)])
    out = apply_views(_batch(ramp, [(list(range(8)), (0, 0, 40, 50), False)]), 16)[0, 0]
    assert out.mean(dim=(1, 2, 3)).round().tolist() == [10.0 * i for i in range(8)]


@pytest.mark.parametrize(
    "ops, ref",
    [
        ([("brightness", 1.3)], lambda x: TF.adjust_brightness(x, 1.3)),
        ([("contrast", 0.6)], lambda x: TF.adjust_contrast(x, 0.6)),
        ([("saturation", 1.4)], lambda x: TF.adjust_saturation(x, 1.4)),
        ([("gray", 0.0)], lambda x: TF.rgb_to_grayscale(x, num_output_channels=3)),
        ([("saturation", 0.5), ("brightness", 0.8)], lambda x: TF.adjust_brightness(TF.adjust_saturation(x, 0.5), 0.8)),
        ([("contrast", 1.2), ("saturation", 0.7)], lambda x: TF.adjust_saturation(TF.adjust_contrast(x, 1.2), 0.7)),
    ],
)
def test_colour_matrices_match_torchvision(ops, ref):
    img = torch.rand(3, 20, 20, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.4 + 0.3
    codes = torch.tensor([[COLOUR_OPS.index(n) for n, _ in ops]])
    factors = torch.tensor([[f for _, f in ops]])
    mb = colour_matrices(codes, factors, (img.reshape(3, -1).mean(1) * 255)[None]).double()[0]
    got = (torch.einsum("ij,jhw->ihw", mb[:, :3], img * 255) + mb[:, 3, None, None]) / 255
    assert torch.allclose(got, ref(img.float()).double(), atol=2e-3)


def test_colour_step_of_apply_views_uses_the_clip_mean():
    frames = np.clip(_textured(4, 16, 16) // 2 + 60, 0, 255).astype(np.uint8)
    ops = [("contrast", 0.5), ("brightness", 1.2)]
    out = apply_views(_batch(frames, [([0, 1, 2, 3], (0, 0, 16, 16), False)], [ops]), 16)[0, 0].double()
    x = torch.from_numpy(frames).double()
    mean = x[::4, ::8, ::8].reshape(-1, 3).mean(0)  # the documented 4 x 8 x 8 subsample
    codes, factors = torch.tensor([[2, 1]]), torch.tensor([[0.5, 1.2]])
    mb = colour_matrices(codes, factors, mean[None].float()).double()[0]
    ref = (x @ mb[:, :3].T + mb[:, 3]).clamp(0, 255)
    assert torch.allclose(out, ref, atol=1e-3)


def test_hue_rotation_keeps_grey_and_full_turn_is_identity():
    mb = colour_matrices(torch.tensor([[4], [4]]), torch.tensor([[0.13], [1.0]]), torch.full((2, 3), 100.0))
    assert torch.allclose(mb[0, :, :3] @ torch.full((3,), 90.0) + mb[0, :, 3], torch.full((3,), 90.0), atol=1e-3)
    assert torch.allclose(mb[1, :, :3], torch.eye(3), atol=1e-5)


def test_quantize_rounds_half_up_and_clamps():
    frames = _textured(3, 20, 20)
    clips = [([0, 1, 2], (2, 3, 15, 13), False)]
    for ops in ([("brightness", 1.7)], [("contrast", 0.3), ("hue", 0.2)], []):
        batch = _batch(frames, clips, [ops])
        exact, u8 = apply_views(batch, 16), apply_views(batch, 16, quantize=True)
        assert torch.equal(u8, (exact + 0.5).floor().clamp(0, 255).to(torch.uint8))


def test_identity_when_nothing_is_drawn():
    frames = _textured(2, 32, 32)
    out = apply_views(_batch(frames, [([0, 1], (0, 0, 32, 32), False)]), 32, quantize=True)[0, 0]
    assert torch.equal(out, torch.from_numpy(frames))  # full square crop at size, no colour, no RAD


def test_colour_draws_follow_the_probabilities():
    rng = np.random.default_rng(0)
    cfg = LoaderConfig(color_jitter=0.8, grayscale=0.2)
    draws = [draw_colour(cfg, rng)[0] for _ in range(4000)]
    jitter = np.mean([1 in c for c in draws])
    gray = np.mean([5 in c for c in draws])
    assert abs(jitter - 0.8) < 0.03 and abs(gray - 0.2) < 0.03
    assert all(sorted(c[:4]) == [1, 2, 3, 4] for c in draws if 1 in c)  # all four ops, in a random order


def test_normalize_reference_and_errors():
    x = torch.randint(0, 256, (2, 4, 5, 6, 3), dtype=torch.uint8).permute(0, 4, 1, 2, 3)  # channels-last view
    y = normalize(x, "cpu")
    assert y.dtype == torch.float32 and y.shape == x.shape and y.is_contiguous()
    for c in range(3):
        ref = (x[:, c].double() / 255 - MEAN[c]) / STD[c]
        assert torch.allclose(y[:, c].double(), ref, atol=1e-5)
    with pytest.raises(ValueError, match="3, T, H, W"):
        normalize(torch.zeros(2, 4, 5, 6, dtype=torch.uint8), "cpu")
