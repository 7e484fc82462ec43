"""Clip augmentation: one set of parameters per clip, checked against torchvision; normalisation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF

from moquad.config import LoaderConfig
from moquad.data.augment import (
    MEAN,
    STD,
    ClipAug,
    apply_aug,
    apply_colour,
    augment_clip,
    colour_affine,
    colour_map,
    normalize,
    random_crop_box,
    round_into,
    to_uint8,
)


def _textured(t: int = 6, h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)


def test_crop_and_flip_match_torchvision():
    frames = _textured()
    aug = ClipAug(top=5, left=9, height=30, width=41, flip=True)
    out = to_uint8(apply_aug(frames, aug, 24))  # (T, 24, 24, 3): clips are channels-last in the loader
    ref = TF.resized_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), 5, 9, 30, 41, [24, 24], antialias=True)
    ref = TF.horizontal_flip(ref).permute(0, 2, 3, 1)
    assert out.shape == (6, 24, 24, 3) and out.dtype == torch.uint8
    assert (out.int() - ref.int()).abs().max() <= 1


def test_same_augmentation_on_every_frame():
    frame = _textured(1)[0]
    frames = np.stack([frame] * 5)
    for seed in range(5):
        out = augment_clip(frames, LoaderConfig(size=32, color_jitter=1.0, grayscale=0.5), np.random.default_rng(seed))
        assert torch.equal(out[0:1].expand_as(out), out)  # identical input frames stay identical


def test_frame_order_is_kept_and_clips_differ():
    frames = np.stack([np.full((40, 50, 3), 10 * i, dtype=np.uint8) for i in range(8)])
    cfg = LoaderConfig(size=16, color_jitter=0.0, grayscale=0.0)
    out = augment_clip(frames, cfg, np.random.default_rng(0))
    assert out.mean(dim=(1, 2, 3)).round().tolist() == [10.0 * i for i in range(8)]
    crops = {random_crop_box(40, 50, (0.3, 1.0), np.random.default_rng(s)) for s in range(10)}
    assert len(crops) > 5  # independent draws between clips


def _apply(m: np.ndarray, b: np.ndarray, img: torch.Tensor) -> torch.Tensor:
    return torch.einsum("ij,jhw->ihw", torch.from_numpy(m).double(), img.double() * 255) / 255 + torch.from_numpy(b)[
        :, None, None
    ] / 255


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
def test_colour_affine_matches_torchvision(ops, ref):
    img = torch.rand(3, 20, 20, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.4 + 0.3
    mean = (img.reshape(3, -1).mean(1) * 255).numpy()
    m, b = colour_affine(ops, mean)
    expected = ref(img.float()).double()
    assert torch.allclose(_apply(m, b, img), expected, atol=2e-3)


def test_hue_rotation_keeps_grey_and_full_turn_is_identity():
    m, b = colour_affine([("hue", 0.13)], np.full(3, 100.0))
    grey = np.array([90.0, 90.0, 90.0])
    assert np.allclose(m @ grey + b, grey, atol=1e-3)
    m1, _ = colour_affine([("hue", 1.0)], np.full(3, 100.0))
    assert np.allclose(m1, np.eye(3), atol=1e-5)


def test_normalize_reference_and_errors():
    x = torch.randint(0, 256, (2, 4, 5, 6, 3), dtype=torch.uint8).permute(0, 4, 1, 2, 3)  # channels-last view
    y = normalize(x, "cpu")
    assert y.dtype == torch.float32 and y.shape == x.shape and y.is_contiguous()
    for c in range(3):
        ref = (x[:, c].double() / 255 - MEAN[c]) / STD[c]
        assert torch.allclose(y[:, c].double(), ref, atol=1e-5)
    with pytest.raises(ValueError, match="3, T, H, W"):
        normalize(torch.zeros(2, 4, 5, 6, dtype=torch.uint8), "cpu")


def test_to_uint8_rounds_and_clamps():
    x = torch.tensor([-3.0, 0.49, 0.5, 254.6, 300.0])
    assert to_uint8(x).tolist() == [0, 0, 1, 255, 255]
    out = torch.zeros(4, dtype=torch.uint8)
    pre = torch.tensor([0.0, 0.49, 0.5, 254.6]) + 0.5  # the loader folds +0.5 into its last float op
    assert round_into(pre, out) is out and out.tolist() == [0, 0, 1, 255]


def test_colour_map_on_a_clip_matches_the_matrix():
    clip = torch.from_numpy(_textured(3, 16, 16))
    aug = ClipAug(0, 0, 16, 16, False, (("saturation", 0.5), ("brightness", 1.2)))
    m, b = colour_map(clip, aug)
    got = apply_colour(clip, m, b)
    ref = (clip.double() @ m.double().T + b.double()).clamp(0, 255)
    assert got.shape == clip.shape and torch.allclose(got.double(), ref, atol=1e-3)
    assert colour_map(clip, ClipAug(0, 0, 16, 16, False)) is None


def test_no_colour_ops_when_disabled():
    cfg = dataclasses.replace(LoaderConfig(), color_jitter=0.0, grayscale=0.0, flip=False, crop_scale=(1.0, 1.0))
    frames = _textured(2, 32, 32)
    out = to_uint8(augment_clip(frames, dataclasses.replace(cfg, size=32), np.random.default_rng(0)))
    assert torch.equal(out, torch.from_numpy(frames))  # full square crop at size: identity


def test_normalize_applies_a_colour_map_per_clip():
    x = torch.randint(0, 256, (2, 3, 3, 2, 4, 4), dtype=torch.uint8)  # (B, V, 3, T, H, W)
    colour = torch.rand(2, 3, 3, 4) * torch.tensor([1.0, 1.0, 1.0, 40.0])
    y = normalize(x, "cpu", colour=colour)
    for b, v, t, i, j in [(0, 0, 0, 0, 0), (1, 2, 1, 3, 2), (0, 1, 1, 2, 3)]:
        rgb = x[b, v, :, t, i, j].double()
        mapped = (colour[b, v, :, :3].double() @ rgb + colour[b, v, :, 3].double()).clamp(0, 255)
        ref = (mapped / 255 - torch.tensor(MEAN, dtype=torch.float64)) / torch.tensor(STD, dtype=torch.float64)
        assert torch.allclose(y[b, v, :, t, i, j].double(), ref, atol=1e-4)
    with pytest.raises(ValueError, match="colour"):
        normalize(x, "cpu", colour=torch.zeros(2, 3, 3, 3))
