"""Which frames a clip uses: ONE rule for training and evaluation, and the speeds n, m of a video.

A clip is ``frames`` indices ``start, start + d, ..., start + (frames - 1) * d`` at dilation (frame
step) ``d``; it FITS a video of ``num_frames`` frames when its span ``(frames - 1) * d + 1`` does.
Only the frames a clip uses are ever decoded.

No jump cuts: a clip never wraps around the end of a video (a loop would put a cut into exactly the
clips at the larger dilation -- the Intra-Negs -- and hand the network a "cut detector" shortcut),
and never freezes on the last frame. Instead:

- **Speeds are drawn among the dilations that fit.** ``n`` (anchor, positive) and ``m``
  (Intra-Negs) are two different dilations of ``LoaderConfig.dilations`` drawn uniformly without
  replacement from those that fit the video (:func:`draw_speeds`).
- **Fewer than two fit** (a short video): the speed disturbance cannot be made without an
  artefact, so the Intra-Negs of that video are its clip at ``n`` played BACKWARDS (the paper's
  "reverse" motion disturbance, Table 5): no view has a cut or a freeze the others lack.
- **None fits** (shorter than the span at the smallest dilation): every clip is the whole video
  STRETCHED to ``frames`` indices, ``round(linspace(0, num_frames - 1, frames))`` (frames repeated
  evenly, never at one end), the same for every view; the Intra-Negs are its reverse. Evaluation
  uses the same stretched clip for such videos.

The rule used for a video is reported as ``speed``, ``reverse`` or ``stretch`` (the loader's per-video info),
and ``moquad info`` / the start of ``moquad pretrain`` count the videos each dilation cannot fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def clip_span(frames: int, dilation: int) -> int:
    """Number of source frames a clip covers."""
    return (frames - 1) * dilation + 1


def fitting(num_frames: int, frames: int, dilations: Sequence[int]) -> list[int]:
    """The distinct dilations whose clip fits a video of ``num_frames`` frames, ascending."""
    return [d for d in sorted(set(int(x) for x in dilations)) if clip_span(frames, d) <= num_frames]


def clip_indices(num_frames: int, frames: int, dilation: int, start: int = 0) -> np.ndarray:
    """Frame indices of the clip at ``start``; the stretched whole video when the clip does not fit."""
    if num_frames < 1:
        raise ValueError("a video with no frames has no clips; re-run `moquad preprocess` (it drops them)")
    if frames < 1 or dilation < 1:
        raise ValueError(f"frames and dilation must be >= 1, got frames={frames}, dilation={dilation}")
    if clip_span(frames, dilation) > num_frames:
        return np.rint(np.linspace(0, num_frames - 1, frames)).astype(np.int64)
    if not 0 <= start <= num_frames - clip_span(frames, dilation):
        raise ValueError(f"start {start} out of range for a {frames}-frame clip at dilation {dilation} "
                         f"of a {num_frames}-frame video")
    return start + dilation * np.arange(frames, dtype=np.int64)


def random_clip(num_frames: int, frames: int, dilation: int, rng: np.random.Generator) -> np.ndarray:
    """A clip at a uniformly random start (the stretched video when it does not fit)."""
    last = num_frames - clip_span(frames, dilation)
    return clip_indices(num_frames, frames, dilation, int(rng.integers(0, last + 1)) if last >= 0 else 0)


def uniform_clips(num_frames: int, frames: int, dilation: int, num_clips: int) -> np.ndarray:
    """``num_clips`` clips with evenly spaced starts (a single one centred) -> int (num_clips, frames)."""
    last = max(num_frames - clip_span(frames, dilation), 0)
    starts = np.rint(np.linspace(0, last, num_clips)).astype(int) if num_clips > 1 else [last // 2]
    return np.stack([clip_indices(num_frames, frames, dilation, int(s)) for s in starts])


def draw_speeds(num_frames: int, frames: int, dilations: Sequence[int],
                rng: np.random.Generator) -> tuple[int, int, str]:
    """``(n, m, rule)`` for one video (module docstring): ``rule`` is speed, reverse or stretch."""
    values = sorted(set(int(d) for d in dilations))  # non-empty and positive: moquad.config checks them
    fit = fitting(num_frames, frames, values)
    if len(fit) >= 2:
        i, j = rng.choice(len(fit), size=2, replace=False)
        return fit[int(i)], fit[int(j)], "speed"
    if len(fit) == 1:
        return fit[0], fit[0], "reverse"
    return values[0], values[0], "stretch"


def unfit_counts(num_frames: Sequence[int], frames: int, dilations: Sequence[int]) -> dict[int, int]:
    """{dilation: number of videos its clip does not fit} (the start-up report of ``moquad pretrain``)."""
    n = np.asarray(num_frames)
    return {int(d): int((n < clip_span(frames, int(d))).sum()) for d in sorted(set(dilations))}
