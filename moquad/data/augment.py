"""Spatial augmentation of one clip (same for every frame, independent between clips) and normalisation.

Clips stay uint8 in the loader (4x less to copy between processes and to the device); float
conversion and mean/std normalisation happen on the device with :func:`normalize`.

Per clip: random resized crop (area ``crop_scale``, aspect 3/4..4/3) resized to ``size`` x ``size``
(bilinear, antialiased), horizontal flip (p=0.5), SimCLR colour jitter with probability
``color_jitter`` (brightness, contrast, saturation 0.8*s, hue 0.2*s, in random order) and
grayscale with probability ``grayscale``. Every colour operation is affine in RGB, so the whole
colour augmentation of a clip is composed into ONE 3x3 matrix plus bias applied in a single pass
(hue = rotation about the grey axis in YIQ space); unlike torchvision, values are clamped once at
the end rather than after each operation. One clip, one set of parameters: motion (temporal
differences between frames) is only changed by the same pixel-wise map on every frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from moquad.config import LoaderConfig

# torchvision's Kinetics-400 statistics (used by its r3d_18 / r2plus1d_18 / s3d weights)
MEAN = (0.43216, 0.394666, 0.37645)
STD = (0.22803, 0.22145, 0.216989)
_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float64)
_RGB2YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ2RGB = np.linalg.inv(_RGB2YIQ)


@dataclass(frozen=True)
class ClipAug:
    """Augmentation parameters of one clip: crop box, flip, colour operations (name, factor) in order."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    colour: tuple[tuple[str, float], ...] = ()


def random_crop_box(
    height: int, width: int, scale: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random resized crop (torchvision's RandomResizedCrop rule)."""
    area = height * width
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    side = min(height, width)  # fallback: central square
    return (height - side) // 2, (width - side) // 2, side, side


def _colour_ops(cfg: LoaderConfig, rng: np.random.Generator) -> list[tuple[str, float]]:
    ops: list[tuple[str, float]] = []
    if cfg.color_jitter > 0 and rng.random() < cfg.color_jitter:
        s = cfg.color_strength
        ops = [
            ("brightness", rng.uniform(max(0.0, 1 - 0.8 * s), 1 + 0.8 * s)),
            ("contrast", rng.uniform(max(0.0, 1 - 0.8 * s), 1 + 0.8 * s)),
            ("saturation", rng.uniform(max(0.0, 1 - 0.8 * s), 1 + 0.8 * s)),
            ("hue", rng.uniform(-0.2 * s, 0.2 * s)),
        ]
        ops = [ops[i] for i in rng.permutation(4)]
    if cfg.grayscale > 0 and rng.random() < cfg.grayscale:
        ops.append(("gray", 0.0))
    return ops


def colour_affine(ops: list[tuple[str, float]] | tuple, mean_rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compose colour operations into ``x -> M @ x + b`` (RGB in 0..255); ``mean_rgb``: the clip's mean.

    Contrast blends towards the mean grey level of the (already transformed) clip, as torchvision.
    """
    m = np.eye(3)
    b = np.zeros(3)
    ones = np.ones(3)
    for name, v in ops:
        if name == "brightness":
            step_m, step_b = v * np.eye(3), np.zeros(3)
        elif name == "contrast":
            grey = float(_GRAY @ (m @ mean_rgb + b))
            step_m, step_b = v * np.eye(3), (1 - v) * grey * ones
        elif name == "saturation":
            step_m, step_b = v * np.eye(3) + (1 - v) * np.outer(ones, _GRAY), np.zeros(3)
        elif name == "hue":
            c, s = math.cos(2 * math.pi * v), math.sin(2 * math.pi * v)
            rot = np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
            step_m, step_b = _YIQ2RGB @ rot @ _RGB2YIQ, np.zeros(3)
        elif name == "gray":
            step_m, step_b = np.outer(ones, _GRAY), np.zeros(3)
        else:  # pragma: no cover - internal names only
            raise ValueError(name)
        m, b = step_m @ m, step_m @ b + step_b
    return m.astype(np.float32), b.astype(np.float32)


def sample_aug(height: int, width: int, cfg: LoaderConfig, rng: np.random.Generator) -> ClipAug:
    """Draw one clip's augmentation parameters for frames of ``height`` x ``width``."""
    top, left, h, w = random_crop_box(height, width, tuple(cfg.crop_scale), rng)
    flip = bool(cfg.flip and rng.random() < 0.5)
    return ClipAug(top, left, h, w, flip, tuple(_colour_ops(cfg, rng)))


def crop_resize(frames: np.ndarray, aug: ClipAug, size: int, index: np.ndarray | None = None) -> torch.Tensor:
    """Crop, resize (bilinear, antialiased) and flip: uint8 (T, H, W, 3) -> uint8 (T, size, size, 3).

    ``index`` selects the clip's frames from ``frames`` (gathered together with the crop: one copy).
    Clips stay channels-last (the layout JPEG decoding produces) to avoid transposing them.
    """
    rows, cols = slice(aug.top, aug.top + aug.height), slice(aug.left, aug.left + aug.width)
    crop = frames[index, rows, cols] if index is not None else frames[:, rows, cols]
    x = torch.from_numpy(np.ascontiguousarray(crop)).permute(0, 3, 1, 2)  # channels_last memory
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    if aug.flip:
        x = x.flip(-1)
    return x.permute(0, 2, 3, 1).contiguous()


def colour_map(clip: torch.Tensor, aug: ClipAug) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The clip's colour map ``x -> M @ x + b`` (float32 (3, 3) and (3,)), None without colour ops.

    Contrast needs the clip's mean colour: estimated on a 4 x 8 x 8 (time x height x width)
    subsample of the uint8 clip (T, H, W, 3) -- exact enough, and 256x cheaper than the full mean.
    """
    if not aug.colour:
        return None
    mean = clip[::4, ::8, ::8].reshape(-1, 3).float().mean(dim=0).double().numpy()
    m, b = colour_affine(list(aug.colour), mean)
    return torch.from_numpy(m), torch.from_numpy(b)


def apply_colour(clip: torch.Tensor, m: torch.Tensor, b: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """uint8 or float (T, H, W, 3) -> float32 (T, H, W, 3) ``clamp(M @ rgb + b, 0, 255) (+ offset)``.

    ``offset=0.5`` pre-adds the rounding offset of :func:`round_into` (saves a pass).
    """
    x = clip.permute(0, 3, 1, 2).float()  # channels_last: a 1x1 convolution is the fastest 3x3 colour map
    y = F.conv2d(x, m.view(3, 3, 1, 1), b + offset if offset else b)
    return y.permute(0, 2, 3, 1).contiguous().clamp_(offset, 255 + offset)


def apply_aug(frames: np.ndarray, aug: ClipAug, size: int, index: np.ndarray | None = None) -> torch.Tensor:
    """All of one clip's augmentation: uint8 (T, H, W, 3) -> float32 (T, size, size, 3) in 0..255."""
    clip = crop_resize(frames, aug, size, index)
    cmap = colour_map(clip, aug)
    return apply_colour(clip, *cmap) if cmap is not None else clip.float()


def augment_clip(frames: np.ndarray, cfg: LoaderConfig, rng: np.random.Generator) -> torch.Tensor:
    """Draw parameters and augment one clip: uint8 (T, H, W, 3) -> float32 (T, size, size, 3)."""
    return apply_aug(frames, sample_aug(frames.shape[1], frames.shape[2], cfg, rng), cfg.size)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Round a float tensor to uint8 (clamped to 0..255, half up)."""
    a = np.clip(x.detach().numpy(), 0, 255)
    a += 0.5
    return torch.from_numpy(a.astype(np.uint8))


def round_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write ``x`` (float, already holding value + 0.5 with value in 0..255) into uint8 ``out``.

    Truncating ``value + 0.5`` rounds half up; the loader folds the ``+ 0.5`` into its last float
    operation, so rounding costs a single conversion pass.
    """
    np.copyto(out.numpy(), x.detach().numpy(), casting="unsafe")
    return out


def normalize(x: torch.Tensor, device: torch.device | str, colour: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 clips (..., 3, T, H, W) -> float32 on ``device``: ``(x / 255 - mean) / std``.

    The uint8 tensor is moved first (4x fewer bytes over PCIe), then converted on the device; the
    result is contiguous even when ``x`` is a channels-last view (as the loader's batches are).
    ``colour`` (..., 3, 4) = ``[M | b]`` per clip (the loader's ``colour`` with
    ``colour_on_device``) is applied first: ``clamp(M @ rgb + b, 0, 255)`` on every pixel.
    """
    if x.dim() < 4 or x.shape[-4] != 3:
        raise ValueError(f"expected clips shaped (..., 3, T, H, W), got {tuple(x.shape)}")
    x = x.to(device, non_blocking=True).float()
    if colour is not None:
        if tuple(colour.shape) != (*x.shape[:-4], 3, 4):
            raise ValueError(f"colour must be shaped {(*x.shape[:-4], 3, 4)}, got {tuple(colour.shape)}")
        colour = colour.to(x.device, torch.float32)
        x = torch.einsum("...ij,...jthw->...ithw", colour[..., :3], x) + colour[..., 3, None, None, None]
        x = x.clamp_(0, 255)
    shape = (3, 1, 1, 1)
    mean = torch.tensor(MEAN, device=x.device).view(shape) * 255
    std = torch.tensor(STD, device=x.device).view(shape) * 255
    return ((x - mean) / std).contiguous()
