"""The views of the motion report: ONE centred clip of each video (the evaluation clip rule of
:mod:`moquad.data.clip_frames`) and its controlled variants (:data:`TRANSFORMS`): another crop, played backwards, at
2x and 4x speed, mirrored, still. Every encoder sees the same frames, framed as its authors frame them
(:class:`moquad.eval.encoders.Framing`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moquad.data.clip_frames import uniform_clips
from moquad.data.store import Split
from moquad.eval.clips import resize_short, spatial_crops


def centred(num_frames: int, frames: int, dilation: int) -> np.ndarray:
    """Frame indices of the video's centred clip (the evaluation clip rule, one clip)."""
    return uniform_clips(num_frames, frames, dilation, 1)[0]


def centre_crop(x: torch.Tensor, size: int, framing: Any = None) -> torch.Tensor:
    """uint8 frames (T, H, W, 3) -> uint8 (3, T, size, size): the encoder's framing (None: short side to ``size``),
    centre square (as extract)."""
    return spatial_crops(x, size, 1, framing)[0]


def corner_crop(x: torch.Tensor, size: int, framing: Any = None) -> torch.Tensor:
    """Another crop of the same frames: the top-left square covering 64 % of the centre view's square (short side
    to 1.25 x the framing's), the kind of crop pre-training draws (random-resized crops) and teaches to ignore."""
    short = framing.short_side(size) if framing is not None else size
    y = resize_short(x, round(short * 1.25), framing.antialias if framing is not None else True)[:, :, :size, :size]
    return y.round().clamp(0, 255).to(torch.uint8)


def mirror_crop(x: torch.Tensor, size: int, framing: Any = None) -> torch.Tensor:
    """The centre crop, flipped left <-> right."""
    return centre_crop(x, size, framing).flip(-1)


@dataclass(frozen=True)
class Transform:
    """One variant of a clip: which frames (num_frames, frames, dilation -> indices) and which crop."""

    frames: Callable[[int, int, int], np.ndarray]
    crop: Callable[[torch.Tensor, int, Any], torch.Tensor]
    description: str


# name -> the variant; "clip" is the reference every other one is compared with, "crop" the appearance yardstick
TRANSFORMS: dict[str, Transform] = {
    "clip": Transform(centred, centre_crop, "the centred clip, centre crop"),
    "crop": Transform(centred, corner_crop, "the same frames, another crop (top-left, 64 % of the area)"),
    "reversed": Transform(lambda n, t, d: centred(n, t, d)[::-1].copy(), centre_crop, "the clip played backwards"),
    "speed2": Transform(lambda n, t, d: centred(n, t, 2 * d), centre_crop, "2x speed: the centred clip at 2 x dilation"),
    "speed4": Transform(lambda n, t, d: centred(n, t, 4 * d), centre_crop, "4x speed: the centred clip at 4 x dilation"),
    "mirror": Transform(centred, mirror_crop, "the clip flipped horizontally"),
    "still": Transform(lambda n, t, d: np.repeat(centred(n, t, d)[t // 2], t), centre_crop,
                       "the clip's middle frame repeated (no motion)"),
}
VIEWS = tuple(TRANSFORMS)
SPEEDS = ("clip", "speed2", "speed4")  # the speed classifier's classes: 1x, 2x, 4x


def video_views(split: Split, i: int, frames: int, dilation: int, size: int, framing: Any = None) -> torch.Tensor:
    """Every :data:`TRANSFORMS` view of video ``i`` -> uint8 (views, 3, frames, size, size), framed as ``framing``
    says (an encoder's, :class:`moquad.eval.encoders.Framing`; None: short side to ``size``); each frame decoded
    once and resized once per crop (the crops work frame by frame, so the views share their frames' crops)."""
    n = int(split.num_frames[i])
    idx = {name: tr.frames(n, frames, dilation) for name, tr in TRANSFORMS.items()}
    uniq = np.unique(np.concatenate(list(idx.values())))
    decoded = torch.from_numpy(split.read_frames(i, uniq))
    cropped = {}  # crop -> (the frames its views use, those frames cropped: (3, F, size, size))
    for crop in dict.fromkeys(tr.crop for tr in TRANSFORMS.values()):
        used = np.unique(np.concatenate([idx[name] for name, tr in TRANSFORMS.items() if tr.crop is crop]))
        cropped[crop] = used, crop(decoded[np.searchsorted(uniq, used)], size, framing)
    views = []
    for name, tr in TRANSFORMS.items():
        used, frames_cropped = cropped[tr.crop]
        views.append(frames_cropped[:, np.searchsorted(used, idx[name])])
    return torch.stack(views)


class MotionViews(torch.utils.data.Dataset):
    """(row, [:func:`video_views` for each of ``framings``]) of each video of ``rows`` (a DataLoader decodes them in
    workers); every encoder sees the same frames, framed as its authors frame them."""

    def __init__(self, split: Split, rows: Sequence[int], frames: int, dilation: int, size: int,
                 framings: Sequence[Any] = (None,)):
        self.split, self.rows, self.args, self.framings = split, list(rows), (frames, dilation, size), list(framings)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[int, list[torch.Tensor]]:
        return self.rows[k], [video_views(self.split, self.rows[k], *self.args, f) for f in self.framings]
