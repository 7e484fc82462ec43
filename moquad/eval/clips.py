"""Evaluation clips: deterministic test views and random training clips, read through ``moquad.data.store``.

Temporal: the clip rule of pre-training (:mod:`moquad.data.clip_frames`): ``num_clips`` clips with
evenly spaced starts (one clip: centred); a video shorter than a clip's span is stretched (never looped
or clamped). Training clips of the linear probe and fine-tuning start at random.

Spatial: the short side is resized as the encoder's authors frame it (:class:`moquad.eval.encoders.Framing`: V-JEPA 2
``size * 292 / 256``, torchvision's Kinetics weights ``size * 128 / 112``; a moquad network ``size`` itself;
bilinear, antialiased) and then either the centre
``size x size`` square is taken, or 3 squares along the long side (left/centre/right for landscape,
top/centre/bottom for portrait), as in SlowFast's 3-crop test. Training: short side ``size * 8 / 7``,
random square crop, random horizontal flip unless the protocol's ``flip`` is off
(left/right-sensitive classes: SSv2, direction families).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from moquad.config import LoaderConfig, PretrainConfig
from moquad.data.clip_frames import random_clip, uniform_clips
from moquad.data.store import Split

EVAL_DILATION = 2  # the paper's evaluation dilation (fine-tuning: 16 frames at 2; linear: 32 at stride 2)


@dataclass(frozen=True)
class PretrainClip:
    """The clip an encoder was pre-trained on: frames, crop size, the dilations its clips were drawn at, the
    model input (``moquad.models.INPUTS``)."""

    frames: int
    size: int
    dilations: tuple[int, ...]
    model_input: str

    @property
    def dilation(self) -> int:
        """The evaluation dilation of this encoder: the paper's (2) clamped to the range its clips were drawn
        over, so (1, 2, 4) -> 2, (1, 4) -> 2, (4, 8) -> 4, a method whose clips are all at ``simclr_dilation`` 3 -> 3."""
        return min(max(EVAL_DILATION, self.dilations[0]), self.dilations[-1])

    def matches(self, frames: int, size: int, dilation: int | None) -> bool:
        """Whether a clip of ``frames`` x ``size`` at ``dilation`` (None: not compared) is this one: the same frames
        and size, a dilation in the range it was pre-trained over."""
        return (frames, size) == (self.frames, self.size) and (dilation is None or self.fits(dilation))

    def fits(self, dilation: int) -> bool:
        """Whether ``dilation`` lies in the range the encoder was pre-trained over (a speed between two it saw)."""
        return self.dilations[0] <= dilation <= self.dilations[-1]

    def text(self) -> str:
        """``8x32 (dilations 1,4)``: how a warning or a table names it."""
        return f"{self.frames}x{self.size} (dilations {','.join(map(str, self.dilations))})"


def pretrain_clip(config: Mapping[str, Any] | None) -> PretrainClip:
    """The pre-training clip of a checkpoint's (or a model card's) config dict: THE reader of it (evaluation
    defaults, ``moquad motion``, the export card). Settings it lacks are the config defaults (the paper's
    16 x 224), so a config of None (no checkpoint: fine-tuning from random init) gives those.

    >>> pretrain_clip({"loader": {"frames": 8, "size": 32, "dilations": [4, 8]}}).dilation
    4
    """
    config = config or {}
    loader = {**{k: getattr(LoaderConfig, k) for k in ("frames", "size", "simclr_dilation")},
              "dilations": LoaderConfig().dilations, **(config.get("loader") or {})}
    return PretrainClip(int(loader["frames"]), int(loader["size"]), _dilations(config.get("method"), loader),
                        str(config.get("model_input") or PretrainConfig.model_input))


def _dilations(method: Any, loader: Mapping[str, Any]) -> tuple[int, ...]:
    """The dilations a checkpoint's clips were drawn at: its method's view plans under its loader settings
    (:meth:`moquad.train.methods.Method.dilations`); the loader's ``dilations`` for a method the table no longer
    has, or settings this version cannot read."""
    from moquad.config import ConfigError, update
    from moquad.train.methods import METHODS

    known = {f.name for f in dataclasses.fields(LoaderConfig)}
    if method in METHODS:
        try:
            return METHODS[method].dilations(update(LoaderConfig(), {k: v for k, v in loader.items() if k in known}))
        except (ConfigError, ValueError):
            pass
    return tuple(sorted(int(d) for d in loader["dilations"]))


def resize_short(x: torch.Tensor, size: int, antialias: bool = True, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> float (3, T, h, w) with min(h, w) == size and the long side in proportion, or (h, w) ==
    ``shape``; values still 0..255. ``antialias``: filter before a downscale (off: as torchvision's video weights'
    transforms resize)."""
    t, h, w, _ = x.shape
    scale = size / min(h, w)
    nh, nw = shape or (max(size, round(h * scale)), max(size, round(w * scale)))
    y = x.permute(0, 3, 1, 2).float()  # (T, 3, H, W)
    if (nh, nw) != (h, w):
        y = F.interpolate(y, size=(nh, nw), mode="bilinear", align_corners=False, antialias=antialias)
    return y.permute(1, 0, 2, 3)


def spatial_crops(x: torch.Tensor, size: int, crops: int, framing: Any = None) -> torch.Tensor:
    """uint8 frames (T, H, W, 3) -> uint8 (crops, 3, T, size, size): the short side resized as the encoder's
    ``framing`` says (:class:`moquad.eval.encoders.Framing`; None: to ``size``), then ``crops`` squares."""
    y = (resize_short(x, size) if framing is None else
         resize_short(x, size, framing.antialias, framing.resized(x.shape[1], x.shape[2], size)))
    _, _, h, w = y.shape
    if crops == 1:  # EvalConfig.crops: 1 or 3
        offsets = [framing.centre(h, w, size) if framing is not None else ((h - size) // 2, (w - size) // 2)]
    elif w >= h:
        offsets = [((h - size) // 2, x0) for x0 in (0, (w - size) // 2, w - size)]
    else:
        offsets = [(y0, (w - size) // 2) for y0 in (0, (h - size) // 2, h - size)]
    out = [y[:, :, y0 : y0 + size, x0 : x0 + size] for y0, x0 in offsets]
    return torch.stack(out).round_().clamp_(0, 255).to(torch.uint8)


def random_crop_flip(x: torch.Tensor, size: int, flip: bool, rng: np.random.Generator) -> torch.Tensor:
    """Training-time spatial augmentation: short side -> size*8/7, random square crop, random h-flip (if ``flip``)."""
    y = resize_short(x, round(size * 8 / 7))
    _, _, h, w = y.shape
    y0, x0 = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
    y = y[:, :, y0 : y0 + size, x0 : x0 + size]
    if rng.random() < 0.5 and flip:  # the draw happens either way: the crops do not depend on ``flip``
        y = y.flip(-1)
    return y.round_().clamp_(0, 255).to(torch.uint8)


def eval_clips(split: Split, i: int, frames: int, dilation: int, num_clips: int, size: int, crops: int,
               framing: Any = None) -> torch.Tensor:
    """All test views of video ``i`` -> uint8 (num_clips * crops, 3, frames, size, size), clip-major, framed as
    ``framing`` says (:func:`spatial_crops`)."""
    idx = uniform_clips(int(split.num_frames[i]), frames, dilation, num_clips)
    decoded = torch.from_numpy(split.read_frames(i, idx.reshape(-1)))
    per_clip = decoded.view(num_clips, frames, *decoded.shape[1:])
    return torch.cat([spatial_crops(c, size, crops, framing) for c in per_clip])


def labelled(split: Split) -> np.ndarray:
    """Manifest indices of the videos with a known class (label >= 0)."""
    return np.flatnonzero(split.label >= 0)


class TrainClips(torch.utils.data.Dataset):
    """One random augmented clip per video of ``rows``; the randomness is a function of (seed, epoch, row)."""

    def __init__(self, split: Split, rows: np.ndarray, frames: int, dilation: int, size: int, flip: bool, seed: int):
        self.split, self.rows, self.frames, self.dilation, self.size = split, rows, frames, dilation, size
        self.flip, self.seed = flip, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, int]:
        i = int(self.rows[k])
        rng = np.random.default_rng([self.seed, self.epoch, i])
        idx = random_clip(int(self.split.num_frames[i]), self.frames, self.dilation, rng)
        clip = random_crop_flip(torch.from_numpy(self.split.read_frames(i, idx)), self.size, self.flip, rng)
        return clip, int(self.split.label[i])


class TestViews(torch.utils.data.Dataset):
    """(row, all deterministic test views) of each video of ``rows``; ``framing``: the encoder's
    (:class:`moquad.eval.encoders.Framing`; None: the short side resized to the crop)."""

    def __init__(self, split: Split, rows: np.ndarray | list[int], frames: int, dilation: int, num_clips: int,
                 size: int, crops: int, framing: Any = None):
        self.split, self.rows = split, rows
        self.args = (frames, dilation, num_clips, size, crops, framing)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[int, torch.Tensor]:
        i = int(self.rows[k])
        return i, eval_clips(self.split, i, *self.args)
