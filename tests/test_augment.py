"""Clip augmentation: one set of parameters per clip, checked against torchvision; normalisation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
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


# ---------------------------------------------------------------- augment_on_device: device_augment


def _raw_batch(videos, clips, size, t=3, k=5):
    """A hand-made augment_on_device batch: ``videos`` uint8 (U, H, W, 3) arrays, ``clips`` per video:
    [(frame indices, (top, left, h, w), flip)] (no colour, no RAD)."""
    from moquad.data.disturb import cell_size

    b, v = len(videos), len(clips[0])
    shape = (b, max(x.shape[0] for x in videos), max(x.shape[1] for x in videos), max(x.shape[2] for x in videos), 3)
    raw = torch.full(shape, 255, dtype=torch.uint8)  # padding: bright, so reading it would show
    for i, x in enumerate(videos):
        raw[i, : x.shape[0], : x.shape[1], : x.shape[2]] = torch.from_numpy(x)
    c = cell_size(size, k)
    return {
        "raw": raw,
        "frame_index": torch.tensor([[idx for idx, _, _ in cl] for cl in clips]),
        "box": torch.tensor([[box for _, box, _ in cl] for cl in clips]),
        "flip": torch.tensor([[fl for _, _, fl in cl] for cl in clips]),
        "colour_ops": torch.zeros(b, v, 5, dtype=torch.int64),
        "colour_factors": torch.zeros(b, v, 5),
        "cells": torch.zeros(b, v, k * k, c, c, 3, dtype=torch.uint8),
        "noise_frame": torch.full((b, v), -1),
        "lam": torch.zeros(b, v),
    }


def _unnormalise(y: torch.Tensor) -> torch.Tensor:
    """(..., 3, T, H, W) normalised -> 0..255 values."""
    shape = (3, 1, 1, 1)
    return (y.double() * torch.tensor(STD).view(shape) + torch.tensor(MEAN).view(shape)) * 255


def _ramp(frames: int, h: int, w: int) -> np.ndarray:
    """R = column, G = row, B = 20 * frame: bilinear sampling of it is exact, so it reads back coordinates."""
    x = np.zeros((frames, h, w, 3), dtype=np.uint8)
    x[..., 0] = np.arange(w)[None, None, :]
    x[..., 1] = np.arange(h)[None, :, None]
    x[..., 2] = (20 * np.arange(frames))[:, None, None]
    return x


def test_device_crop_flip_geometry_on_a_coordinate_ramp():
    """Every output pixel reads the source coordinate of crop-then-resize (align_corners=False, edges
    replicated), per clip, in frames of different sizes padded into one batch."""
    from moquad.data.augment import device_augment

    size = 16
    videos = [_ramp(5, 40, 60), _ramp(4, 50, 44)]
    clips = [[([0, 2, 4], (5, 9, 30, 41), False), ([4, 3, 1], (0, 0, 8, 10), True)],  # downscale / upscale
             [([1, 1, 3], (20, 30, 30, 14), True), ([0, 1, 2], (0, 0, 50, 44), False)]]  # up to the small frame's edge
    out = _unnormalise(device_augment(_raw_batch(videos, clips, size), "cpu", size))
    assert out.shape == (2, 2, 3, 3, size, size)
    j = torch.arange(size, dtype=torch.float64)
    for b, cl in enumerate(clips):
        for v, (idx, (top, left, h, w), flip) in enumerate(cl):
            xs = (left + (j + 0.5) * w / size - 0.5).clamp(left, left + w - 1)
            ys = (top + (j + 0.5) * h / size - 0.5).clamp(top, top + h - 1)
            if flip:
                xs = xs.flip(0)
            for t, f in enumerate(idx):
                assert torch.allclose(out[b, v, 0, t], xs[None, :].expand(size, size), atol=2e-3)
                assert torch.allclose(out[b, v, 1, t], ys[:, None].expand(size, size), atol=2e-3)
                assert torch.allclose(out[b, v, 2, t], torch.full((size, size), 20.0 * f, dtype=torch.float64), atol=2e-3)


def _smooth(frames: int, h: int, w: int, seed: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    x = [np.stack([127 + 100 * np.sin(xx / (4 + c) + yy / (6 + 2 * c) + 0.4 * t + seed) for c in range(3)], -1)
         for t in range(frames)]
    return np.stack(x).astype(np.uint8)


def test_device_crop_resize_is_bilinear_without_antialias_and_close_to_the_cpu_path():
    """Equal to crop + F.interpolate(bilinear, antialias=False) + flip; against the CPU path (antialiased,
    uint8): within its rounding when upscaling, a small mean difference when downscaling."""
    from moquad.data.augment import crop_resize, device_augment

    size = 24
    frames = _smooth(4, 60, 80, 0)
    rng = np.random.default_rng(0)
    up = [(int(rng.integers(0, 40)), int(rng.integers(0, 60)), int(rng.integers(8, 20)), int(rng.integers(8, 20)))
          for _ in range(4)]
    down = [(int(rng.integers(0, 10)), int(rng.integers(0, 20)), int(rng.integers(30, 50)), int(rng.integers(30, 60)))
            for _ in range(4)]
    boxes = up + down
    clips = [[([0, 1, 3], box, bool(i % 2)) for i, box in enumerate(boxes)]]
    out = _unnormalise(device_augment(_raw_batch([frames], clips, size), "cpu", size))[0]  # (V, 3, T, S, S)
    diffs = []
    for v, (idx, (top, left, h, w), flip) in enumerate(clips[0]):
        crop = torch.from_numpy(frames[idx, top : top + h, left : left + w]).permute(0, 3, 1, 2).double()
        ref = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=False, align_corners=False)
        ref = ref.flip(-1) if flip else ref
        assert torch.allclose(out[v].permute(1, 0, 2, 3), ref, atol=2e-3)
        cpu = crop_resize(frames, ClipAug(top, left, h, w, flip), size, index=np.asarray(idx))  # (T, S, S, 3) uint8
        diffs.append((out[v].permute(1, 2, 3, 0) - cpu.double()).abs())
    up_diff, down_diff = torch.stack(diffs[:4]), torch.stack(diffs[4:])
    assert up_diff.max() <= 1.01  # upscaling: the same filter; the CPU path rounds to uint8
    # downscaling 1.2-2.5x: 2-tap bilinear vs antialiased filter; measured mean 1.0, max 7.9 levels (of 255)
    assert down_diff.mean() < 1.5 and down_diff.max() < 12


def test_colour_affine_batch_matches_colour_affine():
    from moquad.data.augment import _colour_ops, colour_affine_batch, colour_codes

    rng = np.random.default_rng(0)
    cfg = LoaderConfig(color_jitter=1.0, grayscale=0.5)
    ops = [_colour_ops(cfg, rng) for _ in range(40)] + [[], [("gray", 0.0)]]
    means = rng.uniform(0, 255, (len(ops), 3))
    codes, factors = zip(*[colour_codes(o) for o in ops])
    got = colour_affine_batch(torch.tensor(codes), torch.tensor(factors), torch.from_numpy(means))
    for g, o, mu in zip(got, ops, means):
        m, b = colour_affine(o, mu)
        assert torch.allclose(g[:, :3], torch.from_numpy(m), atol=1e-5)
        assert torch.allclose(g[:, 3], torch.from_numpy(b), atol=1e-3)


def test_device_augment_normalises_cpu_batches_and_checks_its_input():
    from moquad.data.augment import device_augment

    x = torch.randint(0, 256, (2, 3, 3, 2, 4, 4), dtype=torch.uint8)
    colour = torch.rand(2, 3, 3, 4)
    assert torch.equal(device_augment({"views": x}, "cpu", 4), normalize(x, "cpu"))
    assert torch.equal(device_augment({"views": x, "colour": colour}, "cpu", 4), normalize(x, "cpu", colour=colour))
    batch = _raw_batch([_ramp(3, 8, 8)], [[([0, 1, 2], (0, 0, 8, 8), False)]], 8)
    with pytest.raises(ValueError, match="cells"):
        device_augment({**batch, "cells": batch["cells"][:, :, :3]}, "cpu", 8)
