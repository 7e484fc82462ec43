"""A small synthetic motion dataset, written as real video files in UCF101's layout.

Every video shows a few textured objects moving over a calm textured background. The class is
the TYPE of motion only (translate, rotate, scale, oscillate, orbit); background, object
texture, colour, shape, start position, speed and the motion's direction are drawn
independently of the class. A representation that only encodes appearance therefore retrieves at chance on
it, which makes it a cheap, honest sanity check for motion-focused pre-training.

Layout (as UCF101)::

    OUT/UCF-101/<Class>/v_<Class>_gGG_cCC.avi      MPEG-4 Part 2 in AVI, like UCF101's XviD
    OUT/ucfTrainTestlist/classInd.txt              "1 Translate" ...
    OUT/ucfTrainTestlist/trainlist01.txt           "Translate/v_Translate_g05_c01.avi 1"
    OUT/ucfTrainTestlist/testlist01.txt            "Translate/v_Translate_g01_c01.avi"

As in UCF101 the test split is made of whole groups (the first ~30% of groups), and the
two clips of a group share their background, so a test video never shares a scene with
a training video.
"""

from __future__ import annotations

import math
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

# A class is a TYPE of motion; its direction (angle, sense, grow/shrink), speed, phase and
# start position are random per video. So classes are unchanged by horizontal flip, time
# reversal and playback speed, and only a representation of the motion itself separates them.
MOTIONS = ("Translate", "Rotate", "Scale", "Oscillate", "Orbit")
CLIPS_PER_GROUP = 2
FPS = 25
OBJECT_SIDE = (0.3, 0.4)  # side of an object, as a fraction of the frame
# a low-contrast background and several objects make the motion a large part of the pixels: with
# one object per video, the tiny 3D CNN trained WITH the class labels memorised the training
# scenes and stayed under 50% test accuracy (4 classes) after 200 steps (README "Evidence")
BACKGROUND_CONTRAST = 0.25


def _texture(rng: np.random.Generator, size: int, smooth: int) -> Image.Image:
    """Random coloured texture: low-resolution noise upsampled (blobs) plus fine noise."""
    low = rng.integers(0, 256, (max(2, size // smooth), max(2, size // smooth), 3), dtype=np.uint8)
    img = Image.fromarray(low).resize((size, size), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, (size, size, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _sprite(rng: np.random.Generator, side: int) -> tuple[Image.Image, Image.Image]:
    """A textured object with an irregular (asymmetric) polygon mask, so rotation is visible."""
    tex = _texture(rng, side, smooth=int(rng.integers(1, 4)))
    tint = rng.integers(0, 256, 3)
    arr = (np.asarray(tex, dtype=np.float32) * 0.6 + tint * 0.4).astype(np.uint8)
    mask = Image.new("L", (side, side), 0)
    n = int(rng.integers(3, 7))
    angles = np.sort(rng.uniform(0, 2 * math.pi, n))
    radii = rng.uniform(0.3, 0.5, n) * side
    pts = [(side / 2 + r * math.cos(a), side / 2 + r * math.sin(a)) for a, r in zip(angles, radii)]
    ImageDraw.Draw(mask).polygon(pts, fill=255)
    # a notch marks the orientation even for near-regular polygons
    ImageDraw.Draw(mask).ellipse([side * 0.45, side * 0.05, side * 0.6, side * 0.2], fill=0)
    # a dark or bright outline keeps the object visible on any background
    sprite = Image.fromarray(arr)
    edge = np.asarray(mask.filter(ImageFilter.FIND_EDGES)) > 0
    out = np.asarray(sprite).copy()
    out[edge] = 0 if rng.random() < 0.5 else 255
    return Image.fromarray(out), mask


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """A smooth, low-contrast scene so the objects stand out whatever their colours."""
    arr = np.asarray(_texture(rng, size, smooth=int(rng.integers(4, 12))), dtype=np.float32)
    grey = rng.uniform(60, 200)
    return Image.fromarray((arr * BACKGROUND_CONTRAST + grey * (1 - BACKGROUND_CONTRAST)).astype(np.uint8))


def _pose(motion: str, o: dict, speed: float, size: int, t: int) -> tuple[float, float, float, float]:
    """(x, y, angle, scale) of object ``o`` at frame ``t``."""
    x, y, angle, scale = o["x0"], o["y0"], o["angle0"], 1.0
    if motion == "Translate":
        x, y = x + speed * t * math.cos(o["direction"]), y + speed * t * math.sin(o["direction"])
    elif motion == "Rotate":
        angle = angle + o["sense"] * 6 * speed * t
    elif motion == "Scale":
        phase = (t * speed / size * 2 + o["phase"]) % 1.0  # sawtooth so long videos keep the motion
        scale = 0.5 + phase if o["sense"] > 0 else 1.5 - phase
    elif motion == "Oscillate":
        offset = size / 8 * math.sin(2 * math.pi * speed * t / 24 + o["angle0"])
        x, y = x + offset * math.cos(o["direction"]), y + offset * math.sin(o["direction"])
    elif motion == "Orbit":
        a = o["sense"] * speed * t / (size / 4) + o["angle0"]
        x, y = x + size / 4 * math.cos(a), y + size / 4 * math.sin(a)
    else:
        raise ValueError(f"unknown motion {motion!r}")
    return x, y, angle, scale


def _render(motion: str, background: Image.Image, rng: np.random.Generator, size: int, frames: int,
            objects: int) -> np.ndarray:
    """Frames (T, H, W, 3) uint8 of one video of class ``motion``: ``objects`` objects, one motion type."""
    speed = rng.uniform(1.2, 1.6) * size / 64  # pixels per frame at 25 fps, shared by the video's objects
    objs = []
    for _ in range(objects):
        side = int(size * rng.uniform(*OBJECT_SIDE))
        sprite, mask = _sprite(rng, side)
        objs.append(dict(side=side, sprite=sprite, mask=mask, x0=rng.uniform(0, size), y0=rng.uniform(0, size),
                         angle0=rng.uniform(0, 360), phase=rng.uniform(0, 1),
                         direction=rng.uniform(0, 2 * math.pi),  # of travel (Translate) or swing (Oscillate)
                         sense=1 if rng.random() < 0.5 else -1))  # rotation / orbit sense, grow or shrink
    out = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        frame = background.copy()
        for o in objs:
            x, y, angle, scale = _pose(motion, o, speed, size, t)
            spr, msk = o["sprite"], o["mask"]
            if scale != 1.0:
                s = max(2, int(o["side"] * scale))
                spr, msk = spr.resize((s, s), Image.BILINEAR), msk.resize((s, s), Image.BILINEAR)
            if motion == "Rotate":
                spr, msk = spr.rotate(angle, resample=Image.BILINEAR), msk.rotate(angle, resample=Image.BILINEAR)
            w = spr.size[0]
            # wrap around the borders so the object is always visible, whatever the length
            for dx in (-size, 0, size):
                for dy in (-size, 0, size):
                    px, py = int(x % size - w / 2 + dx), int(y % size - w / 2 + dy)
                    if -w < px < size and -w < py < size:
                        frame.paste(spr, (px, py), msk)
        out[t] = np.asarray(frame)
    return out


def _write_avi(path: Path, frames: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.avi")
    with av.open(str(tmp), "w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=FPS)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000
        for arr in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    tmp.replace(path)


def make_synth(
    out: str | Path, classes: int = 4, per_class: int = 8, size: int = 64, frames: int = 48, seed: int = 0,
    objects: int = 3,
) -> Path:
    """Write the dataset under ``out`` and return ``out``.

    ``classes`` (1..5) motion classes with ``per_class`` videos each, ``size`` x ``size``
    pixels, ``frames`` frames at 25 fps, ``objects`` objects per video (all with the video's
    motion type, each with its own texture, shape, position and direction). Deterministic for a given seed.
    """
    if not 1 <= classes <= len(MOTIONS):
        raise ValueError(f"--classes must be between 1 and {len(MOTIONS)} (got {classes})")
    if per_class < 2:
        raise ValueError("--per-class must be at least 2 (one test group and one train group)")
    if objects < 1:
        raise ValueError(f"--objects must be at least 1 (got {objects})")
    if size < 16 or frames < 2:
        raise ValueError("--size must be >= 16 pixels and --frames >= 2")
    out = Path(out)
    names = MOTIONS[:classes]
    n_groups = math.ceil(per_class / CLIPS_PER_GROUP)
    n_test_groups = max(1, min(n_groups - 1, round(n_groups * 0.3)))
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label, name in enumerate(names, start=1):
        background = None
        for j in range(per_class):
            g, c = j // CLIPS_PER_GROUP + 1, j % CLIPS_PER_GROUP + 1
            if c == 1:  # the clips of a group share their scene, as in UCF101
                background = _background(rng, size)
            rel = f"{name}/v_{name}_g{g:02d}_c{c:02d}.avi"
            _write_avi(out / "UCF-101" / rel, _render(name, background, rng, size, frames, objects))
            (test.append(rel) if g <= n_test_groups else train.append(f"{rel} {label}"))
    lists = out / "ucfTrainTestlist"
    lists.mkdir(parents=True, exist_ok=True)
    (lists / "classInd.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, start=1)))
    (lists / "trainlist01.txt").write_text("".join(f"{r}\n" for r in train))
    (lists / "testlist01.txt").write_text("".join(f"{r}\n" for r in test))
    return out
