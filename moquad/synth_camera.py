"""The ``camera`` family: camera pans and zooms cut from REAL footage (``moquad synth --kind camera --source DIR``).

Each video is a moving window over consecutive frames of a real clip: the class is the window's motion
(``PanLeft``: the window slides left, so the scene moves right in the frame; ``ZoomIn``: the window shrinks,
so the scene grows), its speed is random per video, its heading jittered by up to 15 degrees, its start random.
Everything else is real: the footage's own content, lighting and motion (people walking, a real camera
shaking) are class-free, so a still frame predicts the class at chance and only the motion of the whole
scene separates the classes.

Train and test come from DIFFERENT source videos (``source_split``: a seeded ~30 % of the sources are test
sources), so a test video never shares footage with a training video; both clips of a group share a source
(UCF101's groups). ``OUT/sources.csv`` lists which source each video was cut from.

Under a horizontal flip PanLeft and PanRight swap; under time reversal every class swaps with its pair. So
with the default ``--classes 4`` (PanLeft, PanRight, ZoomIn, ZoomOut) pre-training must not flip the views
of a quadruple independently (``loader.flip: shared`` or ``none``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CAMERA = ("PanLeft", "PanRight", "ZoomIn", "ZoomOut", "PanUp", "PanDown")
PAN_HEADING = {"PanLeft": 180.0, "PanRight": 0.0, "PanUp": -90.0, "PanDown": 90.0}  # window motion; y down
HEADING_JITTER = 15.0
PAN_SPEED = (0.8, 1.6)  # output pixels per frame at 48 px (scaled with the size)
ZOOM_FACTOR = (1.6, 2.4)  # the window's side changes by this factor over the video
SOURCE_SIDE = 2.5  # sources are decoded with a short side of this many output sizes
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")
TEST_SHARE = 0.3


def load_sources(source: str | Path, size: int, frames: int) -> list[tuple[str, np.ndarray]]:
    """[(file name, frames (N, H, W, 3) uint8 with short side ``SOURCE_SIDE * size``)] of every readable video
    with at least ``frames`` frames, sorted by name (at most 4 x ``frames`` frames are kept from each)."""
    from moquad.data.video_file import UnreadableVideo, decode_frames

    root = Path(source)
    if not root.is_dir():
        raise ValueError(f"--source {root} is not a folder of videos")
    short, out, skipped = int(round(SOURCE_SIDE * size)), [], []

    def convert(frame: Any) -> np.ndarray:
        w, h = frame.width, frame.height
        scale = short / min(w, h)
        return frame.to_ndarray(format="rgb24", width=max(short, round(w * scale)) // 2 * 2,
                                height=max(short, round(h * scale)) // 2 * 2)

    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file()):
        try:
            decoded = decode_frames(path, convert, limit=4 * frames)
        except UnreadableVideo as e:  # not a video: skipped, and named if too few are left
            skipped.append(str(e).split("; ")[0])
            continue
        if len(decoded) >= frames:
            out.append((path.name, decoded))
    if len(out) < 2:
        why = f"; skipped: {', '.join(skipped)}" if skipped else ""
        raise ValueError(f"--source {root} needs at least 2 readable videos of >= {frames} frames (found "
                         f"{len(out)}){why}")
    return out


def source_split(names: list[str], seed: int) -> set[str]:
    """The test sources: a seeded ``TEST_SHARE`` of them (at least one; at least one left for training)."""
    k = max(1, min(len(names) - 1, round(len(names) * TEST_SHARE)))
    order = np.random.default_rng([seed, 7]).permutation(len(names))
    return {names[i] for i in order[:k]}


def _windows(name: str, hw: tuple[int, int], size: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """(frames, 4) float windows (top, left, height, width) in source pixels for one video of class ``name``."""
    h, w = hw
    t = np.arange(frames, dtype=np.float64)
    if name in PAN_HEADING:
        side = rng.uniform(0.5, 0.7) * min(h, w)
        heading = math.radians(PAN_HEADING[name] + rng.uniform(-HEADING_JITTER, HEADING_JITTER))
        step = np.array([math.sin(heading), math.cos(heading)])  # (dy, dx) per unit of speed
        speed = rng.uniform(*PAN_SPEED) * size / 48 * side / size  # source pixels per frame
        room = np.array([h - side, w - side])  # the whole path must stay inside the frame
        travel = np.abs(step) * (frames - 1)
        speed = min(speed, *(room[travel > 1e-9] / travel[travel > 1e-9]))
        lo = np.where(step < 0, -step * speed * (frames - 1), 0.0)
        hi = room - np.where(step > 0, step * speed * (frames - 1), 0.0)
        start = lo + rng.uniform(0, 1, 2) * np.maximum(hi - lo, 0)
        pos = start[None] + t[:, None] * step[None] * speed
        return np.column_stack([pos, np.full(frames, side), np.full(frames, side)])
    big = rng.uniform(0.75, 0.95) * min(h, w)
    factor = rng.uniform(*ZOOM_FACTOR)
    sides = big * factor ** (-t / (frames - 1)) if name == "ZoomIn" else big / factor * factor ** (t / (frames - 1))
    cy, cx = rng.uniform(big / 2, h - big / 2), rng.uniform(big / 2, w - big / 2)
    return np.column_stack([cy - sides / 2, cx - sides / 2, sides, sides])


def render_camera(name: str, footage: np.ndarray, rng: np.random.Generator, size: int, frames: int) -> np.ndarray:
    """Frames (T, size, size, 3) uint8: the class's window motion over ``frames`` consecutive source frames."""
    start = int(rng.integers(0, len(footage) - frames + 1))
    h, w = footage.shape[1:3]
    boxes = _windows(name, (h, w), size, frames, rng)
    boxes[:, 0] = np.clip(boxes[:, 0], 0, h - boxes[:, 2])  # float rounding at the frame's edges
    boxes[:, 1] = np.clip(boxes[:, 1], 0, w - boxes[:, 3])
    out = np.empty((frames, size, size, 3), np.uint8)
    for i, (top, left, hh, ww) in enumerate(boxes):
        img = Image.fromarray(footage[start + i])
        out[i] = np.asarray(img.resize((size, size), Image.BILINEAR, box=(left, top, left + ww, top + hh)))
    return out


def camera_videos(source: str | Path, classes: int, per_class: int, size: int, frames: int, seed: int,
                  clips_per_group: int, test_groups: int) -> Iterator[tuple[str, int, bool, np.ndarray, str]]:
    """``(relative path, label 1.., test?, frames, source name)`` of the family (module docstring)."""
    footage = load_sources(source, size, frames)
    test_names = source_split([n for n, _ in footage], seed)
    pools = {True: [f for f in footage if f[0] in test_names], False: [f for f in footage if f[0] not in test_names]}
    rng = np.random.default_rng(seed)
    for label, name in enumerate(CAMERA[:classes], start=1):
        src = None
        for j in range(per_class):
            g, c = j // clips_per_group + 1, j % clips_per_group + 1
            is_test = g <= test_groups
            if c == 1:  # the clips of a group share a source video
                pool = pools[is_test]
                src = pool[int(rng.integers(0, len(pool)))]
            rel = f"{name}/v_{name}_g{g:02d}_c{c:02d}.avi"
            yield rel, label, is_test, render_camera(name, src[1], rng, size, frames), src[0]
