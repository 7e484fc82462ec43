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


def _crop_grid(box: torch.Tensor, flip: torch.Tensor, height: int, width: int, size: int) -> torch.Tensor:
    """Sampling grid (N, size, size, 2) of each clip's crop box (top, left, h, w) inside a padded frame.

    Same pixel mapping as cropping then resizing with ``align_corners=False`` (output pixel ``j`` reads
    source ``left + (j + 0.5) * w / size - 0.5``), flip folded into the x scale; coordinates are
    clamped to the box, so edges replicate like ``F.interpolate`` on the crop and the padding is
    never read.
    """
    top, left, h, w = box.to(torch.float32).unbind(-1)
    theta = torch.zeros((box.shape[0], 2, 3), dtype=torch.float32, device=box.device)
    theta[:, 0, 0] = torch.where(flip, -w, w) / width
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    grid = F.affine_grid(theta, [box.shape[0], 1, size, size], align_corners=False)
    lo = torch.stack([(2 * left + 1) / width, (2 * top + 1) / height], -1) - 1  # centres of the box's edge pixels
    hi = torch.stack([(2 * (left + w) - 1) / width, (2 * (top + h) - 1) / height], -1) - 1
    return torch.maximum(torch.minimum(grid, hi[:, None, None]), lo[:, None, None])


COLOUR_OPS = ("none", "brightness", "contrast", "saturation", "hue", "gray")  # codes of ``colour_codes``
MAX_COLOUR_OPS = 5  # jitter (4 ops in random order) + grayscale


def colour_codes(ops: list[tuple[str, float]] | tuple) -> tuple[list[int], list[float]]:
    """A clip's colour operations as ``MAX_COLOUR_OPS`` (code, factor) pairs, padded with ``none``."""
    codes, factors = [0] * MAX_COLOUR_OPS, [0.0] * MAX_COLOUR_OPS
    for i, (name, v) in enumerate(ops):
        codes[i], factors[i] = COLOUR_OPS.index(name), float(v)
    return codes, factors


def colour_affine_batch(codes: torch.Tensor, factors: torch.Tensor, mean_rgb: torch.Tensor) -> torch.Tensor:
    """Batched :func:`colour_affine`: codes int (N, K), factors (N, K), clip means (N, 3) -> ``[M | b]`` (N, 3, 4).

    Same composition, in float32 on the tensors' device (contrast blends towards the mean grey of
    the already transformed clip).
    """
    n, dev = codes.shape[0], codes.device
    eye = torch.eye(3, device=dev).expand(n, 3, 3)
    gray = torch.tensor(_GRAY, dtype=torch.float32, device=dev)
    to_gray = torch.ones(3, 1, device=dev) * gray  # rows: GRAY
    rgb2yiq = torch.tensor(_RGB2YIQ, dtype=torch.float32, device=dev)
    yiq2rgb = torch.tensor(_YIQ2RGB, dtype=torch.float32, device=dev)
    m, b = eye.clone(), torch.zeros(n, 3, device=dev)
    mean_rgb = mean_rgb.to(torch.float32)
    for i in range(codes.shape[1]):
        code, v = codes[:, i, None, None], factors[:, i, None, None].to(torch.float32)
        c, s = torch.cos(2 * math.pi * v[:, 0, 0]), torch.sin(2 * math.pi * v[:, 0, 0])
        rot = torch.zeros(n, 3, 3, device=dev)
        rot[:, 0, 0], rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = 1, c, -s, s, c
        step = torch.where(code == 1, v * eye, eye)
        step = torch.where(code == 2, v * eye, step)
        step = torch.where(code == 3, v * eye + (1 - v) * to_gray, step)
        step = torch.where(code == 4, yiq2rgb @ rot @ rgb2yiq, step)
        step = torch.where(code == 5, to_gray.expand(n, 3, 3), step)
        grey = ((m @ mean_rgb[:, :, None])[:, :, 0] + b) @ gray  # (N,)
        shift = torch.where(code[:, :, 0] == 2, (1 - v[:, :, 0]) * grey[:, None], torch.zeros_like(b[:, :1]))
        m, b = step @ m, (step @ b[:, :, None])[:, :, 0] + shift
    return torch.cat([m, b[:, :, None]], dim=2)


def rad_mosaic(cells: torch.Tensor, size: int) -> torch.Tensor:
    """RAD noise images of many clips at once: uint8 windows (..., k*k, c, c, 3) -> float32 (N, 3, size, size).

    Batched :func:`moquad.data.disturb.rad_noise` (row-major k x k mosaic, resized once with the
    same antialiased bilinear filter), without its rounding to uint8 after the resize.
    """
    kk, c = cells.shape[-4], cells.shape[-3]
    k = math.isqrt(kk)
    x = cells.reshape(-1, k, k, c, c, 3).permute(0, 5, 1, 3, 2, 4).reshape(-1, 3, k * c, k * c).float()
    if k * c != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x


def device_augment(batch: dict, device: torch.device | str, size: int, chunk: int = 64) -> torch.Tensor:
    """A loader batch -> float32 normalised views (B, V, 3, T, size, size) on ``device``.

    For ``augment_on_device`` batches (``raw`` frames + per-clip parameters, see
    :mod:`moquad.data.raw`) this is the whole augmentation of the CPU path, batched on the device:
    crop + resize + flip of all clips in ONE batched ``F.grid_sample`` (per ``chunk`` clips; a clip's
    T frames are its channels, its crop box and flip one affine grid; bilinear WITHOUT antialias, so a crop larger than ``size`` is downscaled with a
    2-tap filter where the CPU path uses an antialiased one: see tests/test_augment.py for the
    measured difference), then the colour map ``clamp(M @ rgb + b, 0, 255)``, then RAD/BE
    ``(1 - lam) * V + lam * D``, then normalisation. Unlike the CPU path nothing is rounded to
    uint8 in between; colour maps are composed on the device (:func:`colour_affine_batch`) with the
    clip's mean colour taken from the resized crop as on the CPU path. Frames are gathered and
    converted to float ``chunk`` clips at a time (peak extra memory ~ ``chunk * T`` float frames).
    Other batches (augmented by the workers) are only normalised (:func:`normalize`, with their
    ``colour`` if any), so a training loop can call this on every batch.
    """
    if "raw" not in batch:
        return normalize(batch["views"], device, colour=batch.get("colour"))
    raw = batch["raw"].to(device, non_blocking=True)  # (B, F, H, W, 3) uint8
    b, f, height, width, _ = raw.shape
    index = batch["frame_index"].to(raw.device)  # (B, V, T)
    _, v, t = index.shape
    cells = batch["cells"]  # (B, V, k*k, c, c, 3) uint8
    if cells.dim() != 6 or cells.shape[:2] != (b, v) or math.isqrt(cells.shape[2]) ** 2 != cells.shape[2]:
        raise ValueError(f"batch cells are {tuple(cells.shape)}, expected (B, V, k*k, c, c, 3) with (B, V) = {(b, v)}; "
                         "pass a batch of make_loader(..., augment_on_device=True)")
    n = b * v
    grid = _crop_grid(batch["box"].to(raw.device).reshape(n, 4), batch["flip"].to(raw.device).reshape(n),
                      height, width, size)
    flat = (index + torch.arange(b, device=raw.device)[:, None, None] * f).reshape(n, t)
    frames = raw.reshape(b * f, height, width, 3)
    y = torch.empty((n, t * 3, size, size), dtype=torch.float32, device=raw.device)
    for s in range(0, n, chunk):  # chunks of clips bound the float copy of the frames (~chunk * T frames)
        e = min(n, s + chunk)
        clips = frames.index_select(0, flat[s:e].reshape(-1)).view(e - s, t, height, width, 3)
        x = torch.empty((e - s, t, 3, height, width), dtype=torch.float32, device=raw.device)
        x.copy_(clips.permute(0, 1, 4, 2, 3))  # one clip = T * 3 channels: one sampling grid per clip
        y[s:e] = F.grid_sample(x.view(e - s, t * 3, height, width), grid[s:e], mode="bilinear",
                               padding_mode="border", align_corners=False)
    y = y.view(b, v, t, 3, size, size)
    mean = y[:, :, ::4, :, ::8, ::8].mean(dim=(2, 4, 5)).view(n, 3)  # the CPU path's colour_map subsample
    colour = colour_affine_batch(batch["colour_ops"].to(raw.device).view(n, -1),
                                 batch["colour_factors"].to(raw.device).view(n, -1), mean).view(b, v, 3, 4)
    y = torch.einsum("bvij,bvtjhw->bvtihw", colour[..., :3], y)
    y = y.add_(colour[..., 3].view(b, v, 1, 3, 1, 1)).clamp_(0, 255)
    lam = batch["lam"]
    if bool((lam > 0).any()):
        d = rad_mosaic(cells.to(raw.device, non_blocking=True), size).view(b, v, 3, size, size)
        be = batch["noise_frame"].to(raw.device)
        if bool((batch["noise_frame"] >= 0).any()):  # BE: D is a frame of the augmented clip itself
            frame = y.gather(2, be.clamp(min=0).view(b, v, 1, 1, 1, 1).expand(b, v, 1, 3, size, size))[:, :, 0]
            d = torch.where((be >= 0).view(b, v, 1, 1, 1), frame, d)
        lam = lam.to(raw.device, torch.float32).view(b, v, 1, 1, 1, 1)
        y = y.mul_(1 - lam).add_(lam * d[:, :, None])
    shape = (1, 1, 1, 3, 1, 1)
    mean = torch.tensor(MEAN, device=y.device).view(shape) * 255
    std = torch.tensor(STD, device=y.device).view(shape) * 255
    return y.sub_(mean).div_(std).permute(0, 1, 3, 2, 4, 5).contiguous()
