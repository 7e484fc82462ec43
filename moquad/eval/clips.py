"""Deterministic test-time clips: uniformly spaced in time, centre or 3 crops in space.

Temporal: a clip is ``frames`` frames ``dilation`` apart (span ``(frames-1)*dilation+1``).
``num_clips`` starts are spread uniformly from the first to the last possible start
(``round(linspace(0, num_frames - span, num_clips))``); a single clip is centred. A video
shorter than the span keeps start 0 and repeats its last frame (indices are clamped), so
every video yields a feature.

Spatial: the short side is resized to ``size`` (bilinear, antialiased) and then either the
centre ``size x size`` square is taken, or 3 squares along the long side
(left/centre/right for landscape, top/centre/bottom for portrait), as in SlowFast's
3-crop test.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.nn.functional as F

from moquad.data.frames import read_frames


def clip_indices(num_frames: int, frames: int, dilation: int, num_clips: int) -> np.ndarray:
    """Frame indices of ``num_clips`` uniformly spaced clips -> int array (num_clips, frames)."""
    if num_frames < 1:
        raise ValueError("a video with no frames has no clips; re-run `moquad preprocess` (it drops them)")
    span = (frames - 1) * dilation + 1
    last_start = max(0, num_frames - span)
    if num_clips == 1:
        starts = np.array([last_start // 2])
    else:
        starts = np.round(np.linspace(0, last_start, num_clips)).astype(np.int64)
    idx = starts[:, None] + np.arange(frames)[None, :] * dilation
    return np.minimum(idx, num_frames - 1)


def random_clip_indices(num_frames: int, frames: int, dilation: int, rng: random.Random) -> np.ndarray:
    """One clip at a random start (training clips of linear / fine-tune) -> (frames,)."""
    if num_frames < 1:
        raise ValueError("a video with no frames has no clips; re-run `moquad preprocess` (it drops them)")
    span = (frames - 1) * dilation + 1
    start = rng.randint(0, max(0, num_frames - span))
    return np.minimum(start + np.arange(frames) * dilation, num_frames - 1)


def resize_short(x: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> float (3, T, h, w) with min(h, w) == size (values still 0..255)."""
    t, h, w, _ = x.shape
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    y = x.permute(0, 3, 1, 2).float()  # (T, 3, H, W)
    if (nh, nw) != (h, w):
        y = F.interpolate(y, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
    return y.permute(1, 0, 2, 3)


def spatial_crops(x: torch.Tensor, size: int, crops: int) -> torch.Tensor:
    """uint8 frames (T, H, W, 3) -> uint8 (crops, 3, T, size, size); see module docstring."""
    y = resize_short(x, size)
    _, _, h, w = y.shape
    if crops == 1:
        offsets = [((h - size) // 2, (w - size) // 2)]
    elif crops == 3:
        if w >= h:
            offsets = [((h - size) // 2, x0) for x0 in (0, (w - size) // 2, w - size)]
        else:
            offsets = [(y0, (w - size) // 2) for y0 in (0, (h - size) // 2, h - size)]
    else:
        raise ValueError(f"crops must be 1 or 3, got {crops}")
    out = [y[:, :, y0 : y0 + size, x0 : x0 + size] for y0, x0 in offsets]
    return torch.stack(out).round_().clamp_(0, 255).to(torch.uint8)


def random_crop_flip(x: torch.Tensor, size: int, rng: random.Random) -> torch.Tensor:
    """Training-time spatial augmentation: short side -> size*8/7, random square crop, random h-flip."""
    y = resize_short(x, round(size * 8 / 7))
    _, _, h, w = y.shape
    y0, x0 = rng.randint(0, h - size), rng.randint(0, w - size)
    y = y[:, :, y0 : y0 + size, x0 : x0 + size]
    if rng.random() < 0.5:
        y = y.flip(-1)
    return y.round_().clamp_(0, 255).to(torch.uint8)


READ_COLUMNS = ["video_id", "label", "shard", "jpgs_offset", "frame_offsets", "num_frames"]


def reading_table(table: pa.Table, labelled: bool = False) -> pa.Table:
    """The manifest columns needed to read clips (kept as Arrow: cheap to share with loader workers,
    unlike Python lists of frame offsets); ``labelled`` drops rows with label -1."""
    t = table.select(READ_COLUMNS)
    if labelled:
        t = t.filter(pc.greater_equal(t.column("label"), 0))
    return t


def row_at(table: pa.Table, i: int) -> dict[str, Any]:
    """Row ``i`` of a manifest table as a dict."""
    return table.slice(i, 1).to_pylist()[0]


def read_video_frames(data_dir: str | Path, row: dict[str, Any], indices: np.ndarray) -> torch.Tensor:
    """Decode the frames ``indices`` (any shape) of one manifest row by seeking into its shard."""
    flat = np.asarray(indices).reshape(-1)
    uniq = np.unique(flat)
    frames = read_frames(Path(data_dir) / row["shard"], int(row["jpgs_offset"]), row["frame_offsets"], uniq.tolist())
    pos = np.searchsorted(uniq, flat)
    return torch.from_numpy(frames[pos])  # (len(flat), H, W, 3)


def eval_clips(data_dir: str | Path, row: dict[str, Any], frames: int, dilation: int, num_clips: int,
               size: int, crops: int) -> torch.Tensor:
    """All test views of one video -> uint8 (num_clips * crops, 3, frames, size, size), clip-major."""
    idx = clip_indices(int(row["num_frames"]), frames, dilation, num_clips)
    all_frames = read_video_frames(data_dir, row, idx)
    per_clip = all_frames.view(num_clips, frames, *all_frames.shape[1:])
    return torch.cat([spatial_crops(c, size, crops) for c in per_clip])


def train_clip(data_dir: str | Path, row: dict[str, Any], frames: int, dilation: int, size: int,
               rng: random.Random) -> torch.Tensor:
    """One random, augmented training clip -> uint8 (3, frames, size, size)."""
    idx = random_clip_indices(int(row["num_frames"]), frames, dilation, rng)
    return random_crop_flip(read_video_frames(data_dir, row, idx), size, rng)
