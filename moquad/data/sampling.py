"""Clip sampling by frame index: which frames of a video a clip uses.

A clip is ``frames`` indices ``start, start + d, ..., start + (frames - 1) * d`` at dilation
(frame step) ``d``. Only these frames are ever decoded.

Videos shorter than the span ``(frames - 1) * d + 1`` are **looped**: indices wrap around
(``i mod num_frames``). Looping keeps the frame step, i.e. the playback speed, everywhere but at
the single wrap point, which matters because the speed disturbance (Intra-Negs at another
dilation) is the motion signal MoQuad learns from; clamping would freeze the clip's tail instead.

Speed disturbance: ``n`` (anchor / positive) and ``m`` (intra-negatives) are drawn uniformly
without replacement from ``LoaderConfig.dilations`` (default ``(1, 2, 4)``), so ``m != n`` always.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def clip_span(frames: int, dilation: int) -> int:
    """Number of source frames a clip covers."""
    return (frames - 1) * dilation + 1


def clip_indices(num_frames: int, frames: int, dilation: int, start: int) -> np.ndarray:
    """Frame indices of the clip starting at ``start`` (looped when the video is too short)."""
    if num_frames < 1:
        raise ValueError("cannot sample a clip from a video with no frames")
    if frames < 1 or dilation < 1:
        raise ValueError(f"frames and dilation must be >= 1, got frames={frames}, dilation={dilation}")
    return (start + dilation * np.arange(frames, dtype=np.int64)) % num_frames


def random_clip(num_frames: int, frames: int, dilation: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of a clip at a uniformly random start.

    The start is drawn so the clip fits when the video is long enough; otherwise from any frame
    (the clip then loops).
    """
    span = clip_span(frames, dilation)
    high = num_frames - span + 1 if span <= num_frames else num_frames
    start = int(rng.integers(0, high))
    return clip_indices(num_frames, frames, dilation, start)


def uniform_clips(num_frames: int, frames: int, dilation: int, num_clips: int) -> list[np.ndarray]:
    """``num_clips`` clips with evenly spaced starts over the video (multi-clip evaluation)."""
    span = clip_span(frames, dilation)
    last = max(num_frames - span, 0)
    starts = np.linspace(0, last, num_clips).round().astype(int) if num_clips > 1 else [last // 2]
    return [clip_indices(num_frames, frames, dilation, int(s)) for s in starts]


def draw_dilations(dilations: Sequence[int], rng: np.random.Generator) -> tuple[int, int]:
    """Two different dilations ``(n, m)`` drawn uniformly without replacement."""
    values = sorted(set(int(d) for d in dilations))
    if len(values) < 2 or values[0] < 1:
        raise ValueError(
            f"dilations must hold at least two different positive values (got {tuple(dilations)}); "
            "set loader.dilations, e.g. [1, 2, 4]"
        )
    i, j = rng.choice(len(values), size=2, replace=False)
    return values[int(i)], values[int(j)]
