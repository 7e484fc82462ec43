"""Synthetic motion datasets, written as real video files in UCF101's layout.

Every video shows a few textured objects moving over a textured background. Only the motion
depends on the class: background, object texture, colour, shape, start position and speed are
drawn independently of it, so a representation that only encodes appearance retrieves at chance.
That makes these cheap, honest sanity checks for motion-focused pre-training. Two families
(``kind``, ``moquad synth --kind``):

``types`` (default): the class is the TYPE of motion (Translate, Rotate, Scale, Oscillate, Orbit);
its direction, sense (grow or shrink) and phase are random per video, so every class is unchanged
by a horizontal flip, a time reversal and a playback-speed change. Calm low-contrast background.

``camera``: camera pans and zooms cut from REAL footage (``--source DIR``): :mod:`moquad.synth_camera`.

``directions``: the class is the DIRECTION or SENSE of one motion, in this order: Up, Down
(translation), ZoomIn, ZoomOut (objects grow or shrink at a constant relative rate, restarting
when they reach the end of the scale range), Left, Right (translation), Clockwise,
CounterClockwise (rotation in place). Background and objects have 1/f noise textures (the
amplitude spectrum of natural images, luminance-dominated colour); a camera drift independent of
the class (random direction and speed, up to about the objects' speed) pans the whole periodic
scene; object sizes are log-uniform in every frame of every class, so a still frame is the same
in distribution whatever the class. Within each pair only the sense differs (Up/Down and
ZoomIn/ZoomOut also differ in motion type). What a flip or a time reversal makes of each class
(``FLIPPED``, ``REVERSED``; the tests check both on the videos):

    class              horizontal flip     time reversal
    Up, Down           Up, Down            Down, Up
    ZoomIn, ZoomOut    ZoomIn, ZoomOut     ZoomOut, ZoomIn
    Left, Right        Right, Left         Right, Left
    Clockwise, CCW     CCW, Clockwise      CCW, Clockwise

By default moquad flips each view independently (``LoaderConfig.flip: independent``), so pre-training
teaches flip invariance, and a flip-invariant representation cannot tell apart two classes that
a flip maps onto each other. Hence the order: the first four classes (``--classes 4``, the
default) are each unchanged by a flip, so the task is well posed under the default
augmentations. ``--classes`` 5 to 8 add the flip pairs Left/Right and Clockwise/CounterClockwise:
use them only with ``loader.flip: shared`` (one flip per quadruple) or ``none``; that is what it
buys here, four more separable classes (the full 8-class task), for one augmentation less.
Time reversal maps every class onto another, but moquad never treats a reversed clip as a
positive: ``motion_ops: [reverse]`` makes it an Intra-NEGATIVE, which asks the representation for
exactly the distinction these classes need; an augmentation that reversed one view of a positive
pair would make every pair here ill posed. Playback speed (the default ``motion_ops: [speed]``)
changes no class: speeds are random per video.

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

import functools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from moquad.synth_camera import CAMERA, camera_videos

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

KINDS = ("types", "directions", "camera")  # camera: real footage, moquad.synth_camera
DIRECTIONS = ("Up", "Down", "ZoomIn", "ZoomOut", "Left", "Right", "Clockwise", "CounterClockwise")
FLIP_INVARIANT = 4  # DIRECTIONS[:4] are unchanged by a horizontal flip (module docstring)
FLIPPED = {"Up": "Up", "Down": "Down", "ZoomIn": "ZoomIn", "ZoomOut": "ZoomOut", "Left": "Right", "Right": "Left",
           "Clockwise": "CounterClockwise", "CounterClockwise": "Clockwise"}
REVERSED = {"Up": "Down", "Down": "Up", "ZoomIn": "ZoomOut", "ZoomOut": "ZoomIn", "Left": "Right", "Right": "Left",
            "Clockwise": "CounterClockwise", "CounterClockwise": "Clockwise"}
HEADING = {"Up": -90.0, "Down": 90.0, "Left": 180.0, "Right": 0.0}  # degrees; image y points down
HEADING_JITTER = 20.0  # each object's heading is the class's +- this many degrees
ZOOM_SCALE = (0.6, 1.6)  # object scale range; log-uniform in every frame of every directions class
# zooming moves an object's edge at this fraction of the video's speed: at full speed the scale range
# would wrap every 6-10 frames; at 0.2 it wraps every 29-52 frames, about once per 48-frame demo video
ZOOM_EDGE_SPEED = 0.2
CAMERA_SPEED = 1.5  # default largest camera drift in pixels per frame at 64 px (objects: 1.2 to 1.6)


def _texture(rng: np.random.Generator, size: int, smooth: int) -> Image.Image:
    """Random coloured texture: low-resolution noise upsampled (blobs) plus fine noise."""
    low = rng.integers(0, 256, (max(2, size // smooth), max(2, size // smooth), 3), dtype=np.uint8)
    img = Image.fromarray(low).resize((size, size), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, (size, size, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _sprite(rng: np.random.Generator, tex: Image.Image,
            tint: np.ndarray | None = None) -> tuple[Image.Image, Image.Image]:
    """An object of texture ``tex`` (tinted; random tint if None) with an irregular (asymmetric) polygon
    mask, so rotation is visible."""
    side = tex.size[0]
    tint = rng.integers(0, 256, 3) if tint is None else tint
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
        sprite, mask = _sprite(rng, _texture(rng, side, smooth=int(rng.integers(1, 4))))
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
            _paste_wrapped(frame, spr, msk, x, y)
        out[t] = np.asarray(frame)
    return out


def _paste_wrapped(frame: Image.Image, spr: Image.Image, msk: Image.Image, x: float, y: float) -> None:
    """Paste ``spr`` centred at (x, y), wrapping around the borders so it is always visible."""
    size, w = frame.size[0], spr.size[0]
    for dx in (-size, 0, size):
        for dy in (-size, 0, size):
            px, py = int(x % size - w / 2 + dx), int(y % size - w / 2 + dy)
            if -w < px < size and -w < py < size:
                frame.paste(spr, (px, py), msk)


def _natural_texture(rng: np.random.Generator, size: int, mean: np.ndarray, contrast: float) -> Image.Image:
    """Periodic 1/f^a noise (a in 1..1.5, like natural images), luminance-dominated colour around ``mean``,
    ``contrast`` grey levels of standard deviation."""
    freq = np.hypot(np.fft.fftfreq(size)[:, None], np.fft.rfftfreq(size)[None])
    freq[0, 0] = 1.0
    amp = freq ** -rng.uniform(1.0, 1.5)
    amp[0, 0] = 0.0
    shape = (3, size, size // 2 + 1)
    noise = np.fft.irfft2(amp * (rng.normal(size=shape) + 1j * rng.normal(size=shape)), s=(size, size))
    noise /= noise.std(axis=(1, 2), keepdims=True) + 1e-8
    rgb = noise[0][..., None] + 0.3 * np.einsum("chw,cd->hwd", noise[1:], rng.normal(size=(2, 3)))
    return Image.fromarray(np.clip(mean + contrast * rgb, 0, 255).astype(np.uint8))


def _natural_background(rng: np.random.Generator, size: int) -> Image.Image:
    """A periodic 1/f scene (the camera pans it by rolling), of lower contrast than the objects so they stand out."""
    return _natural_texture(rng, size, rng.uniform(60, 200) + rng.normal(0, 15, 3), rng.uniform(10, 20))


def _direction_object(name: str, rng: np.random.Generator, size: int, ground: float) -> dict:
    """One object of a directions video; every class draws the same quantities (appearance is class-free).

    Its mean grey differs from the background's (``ground``) by 50-90 levels, so it stands out."""
    side = int(size * rng.uniform(*OBJECT_SIDE) * ZOOM_SCALE[1])  # drawn at its largest, shrunk per frame
    grey = ground + (1 if ground < 128 else -1) * rng.uniform(50, 90)
    colour = np.clip(grey + rng.normal(0, 30, 3), 0, 255)
    sprite, mask = _sprite(rng, _natural_texture(rng, side, colour, rng.uniform(25, 45)), colour)
    return dict(sprite=sprite, mask=mask, side=side, x0=rng.uniform(0, size), y0=rng.uniform(0, size),
                angle0=rng.uniform(0, 360), u0=rng.uniform(0, 1),  # u: position in the log-scale range
                heading=HEADING.get(name, 0.0) + rng.uniform(-HEADING_JITTER, HEADING_JITTER), key=None)


def _direction_pose(name: str, o: dict, speed: float, t: int) -> tuple[float, float, float, float]:
    """(x, y, angle in degrees counter-clockwise, scale) of object ``o`` at frame ``t``."""
    x, y, angle, u = o["x0"], o["y0"], o["angle0"], o["u0"]
    radius = o["side"] / ZOOM_SCALE[1] / 2  # at scale 1
    if name in HEADING:
        heading = math.radians(o["heading"])
        x, y = x + speed * t * math.cos(heading), y + speed * t * math.sin(heading)
    elif name in ("Clockwise", "CounterClockwise"):  # the edge moves at the video's speed
        angle += (1 if name == "CounterClockwise" else -1) * math.degrees(speed / radius) * t
    elif name in ("ZoomIn", "ZoomOut"):  # constant relative rate, wrapping from one end of the range to the other
        rate = ZOOM_EDGE_SPEED * speed / radius / math.log(ZOOM_SCALE[1] / ZOOM_SCALE[0])
        u = (u + (1 if name == "ZoomIn" else -1) * rate * t) % 1.0
    else:
        raise ValueError(f"unknown direction {name!r}")
    return x, y, angle, ZOOM_SCALE[0] * (ZOOM_SCALE[1] / ZOOM_SCALE[0]) ** u


def _render_directions(name: str, background: Image.Image, rng: np.random.Generator, size: int, frames: int,
                       objects: int, camera_drift: float) -> np.ndarray:
    """Frames (T, H, W, 3) uint8 of one directions video: the class's motion plus a class-free camera drift of up
    to ``camera_drift`` pixels per frame at 64 px (0: a still camera; the videos are otherwise the same)."""
    speed = rng.uniform(1.2, 1.6) * size / 64
    drift, heading = rng.uniform(0, camera_drift) * size / 64, rng.uniform(0, 2 * math.pi)
    camera, camera_step = rng.uniform(0, size, 2), drift * np.array([math.sin(heading), math.cos(heading)])
    ground = float(np.asarray(background).mean())
    objs = [_direction_object(name, rng, size, ground) for _ in range(objects)]
    out = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        frame = background.copy()
        for o in objs:
            x, y, angle, scale = _direction_pose(name, o, speed, t)
            key = (max(2, round(o["side"] * scale / ZOOM_SCALE[1])), angle)
            if key != o["key"]:  # resize then rotate, the same for every class (only when they change)
                o["key"], o["img"] = key, tuple(im.resize((key[0],) * 2, Image.BILINEAR).rotate(
                    angle, resample=Image.BILINEAR) for im in (o["sprite"], o["mask"]))
            _paste_wrapped(frame, *o["img"], x, y)
        dy, dx = np.floor(camera + camera_step * t + 0.5).astype(int)  # the camera pans the whole scene
        out[t] = np.roll(np.asarray(frame), (dy, dx), axis=(0, 1))
    return out


def _write_avi(path: Path, frames: np.ndarray) -> None:
    import av  # only here: the in-memory generator (synth_videos) needs no video codec

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


def _check(kind: str, classes: int, per_class: int, objects: int, size: int, frames: int,
           camera_drift: float) -> tuple[str, ...]:
    """The family's class names, after checking the arguments (each error names the flag)."""
    if kind not in KINDS:
        raise ValueError(f"--kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if camera_drift != CAMERA_SPEED and kind != "directions":
        raise ValueError(f"--camera-drift applies to --kind directions only (got --kind {kind})")
    if not 0 <= camera_drift <= 8:
        raise ValueError(f"--camera-drift must be between 0 and 8 pixels per frame (got {camera_drift})")
    all_names = {"types": MOTIONS, "directions": DIRECTIONS, "camera": CAMERA}[kind]
    if not 1 <= classes <= len(all_names):
        raise ValueError(f"--classes must be between 1 and {len(all_names)} for --kind {kind} (got {classes})")
    if per_class < 2:
        raise ValueError("--per-class must be at least 2 (one test group and one train group)")
    if objects < 1:
        raise ValueError(f"--objects must be at least 1 (got {objects})")
    if size < 16 or frames < 2:
        raise ValueError("--size must be >= 16 pixels and --frames >= 2")
    return all_names[:classes]


def _test_groups(per_class: int) -> int:
    """As UCF101: the first ~30 % of each class's groups are the test split."""
    n_groups = math.ceil(per_class / CLIPS_PER_GROUP)
    return max(1, min(n_groups - 1, round(n_groups * 0.3)))


def synth_videos(classes: int = 4, per_class: int = 8, size: int = 64, frames: int = 48, seed: int = 0,
                 objects: int = 3, kind: str = "types", camera_drift: float = CAMERA_SPEED,
                 ) -> Iterator[tuple[str, int, bool, np.ndarray]]:
    """The generated videos of :func:`make_synth`, in memory: ``(UCF101-style relative path, label 1.., test?,
    frames)`` (the ``camera`` family needs real footage: :func:`moquad.synth_camera.camera_videos`)."""
    names = _check(kind, classes, per_class, objects, size, frames, camera_drift)
    if kind == "camera":
        raise ValueError("--kind camera cuts videos from real footage: use make_synth(..., source=DIR)")
    scene, render = (_background, _render) if kind == "types" else \
        (_natural_background, functools.partial(_render_directions, camera_drift=camera_drift))
    n_test_groups = _test_groups(per_class)
    rng = np.random.default_rng(seed)
    for label, name in enumerate(names, start=1):
        background = None
        for j in range(per_class):
            g, c = j // CLIPS_PER_GROUP + 1, j % CLIPS_PER_GROUP + 1
            if c == 1:  # the clips of a group share their scene, as in UCF101
                background = scene(rng, size)
            rel = f"{name}/v_{name}_g{g:02d}_c{c:02d}.avi"
            yield rel, label, g <= n_test_groups, render(name, background, rng, size, frames, objects)


def make_synth(
    out: str | Path, classes: int = 4, per_class: int = 8, size: int = 64, frames: int = 48, seed: int = 0,
    objects: int = 3, kind: str = "types", source: str | Path | None = None, camera_drift: float = CAMERA_SPEED,
) -> Path:
    """Write the dataset under ``out`` and return ``out``.

    The first ``classes`` classes of family ``kind`` with ``per_class`` videos each: ``types`` (1..5: Translate,
    Rotate, Scale, Oscillate, Orbit), ``directions`` (1..8: Up, Down, ZoomIn, ZoomOut, then Left, Right,
    Clockwise, CounterClockwise, which a horizontal flip swaps: pre-train those with ``loader.flip`` ``shared``
    or ``none``) or ``camera`` (1..6: PanLeft, PanRight, ZoomIn, ZoomOut, PanUp, PanDown); ``size`` x
    ``size`` pixels, ``frames`` frames at 25 fps, ``objects`` objects per generated video (all with the video's
    motion, each with its own texture, shape and position); ``camera_drift``: the ``directions`` family's largest
    camera drift in pixels per frame at 64 px (0: a still camera); ``camera`` cuts them from the videos in ``source``
    and lists each video's source in ``OUT/sources.csv``. Deterministic for a given seed (and source folder).
    """
    out = Path(out)
    names = _check(kind, classes, per_class, objects, size, frames, camera_drift)
    if kind == "camera":
        if source is None:
            raise ValueError("--kind camera needs --source DIR, a folder of real videos to cut the pans and zooms from")
        videos = camera_videos(source, classes, per_class, size, frames, seed, CLIPS_PER_GROUP, _test_groups(per_class))
    else:
        videos = (v + ("",) for v in synth_videos(classes, per_class, size, frames, seed, objects, kind, camera_drift))
    train, test, sources = [], [], []
    for rel, label, is_test, video, src in videos:
        _write_avi(out / "UCF-101" / rel, video)
        (test.append(rel) if is_test else train.append(f"{rel} {label}"))
        sources.append(f"{rel},{src},{'test' if is_test else 'train'}\n")
    lists = out / "ucfTrainTestlist"
    lists.mkdir(parents=True, exist_ok=True)
    (lists / "classInd.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, start=1)))
    (lists / "trainlist01.txt").write_text("".join(f"{r}\n" for r in train))
    (lists / "testlist01.txt").write_text("".join(f"{r}\n" for r in test))
    if kind == "camera":
        (out / "sources.csv").write_text("video,source,split\n" + "".join(sources))
    return out
