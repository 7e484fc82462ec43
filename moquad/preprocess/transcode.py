"""One video -> JPEG frames with ffmpeg (rotation honoured, short side scaled, audio dropped).

Probing uses PyAV (``metadata_errors="replace"``: real files carry invalid UTF-8 tags). Decoding
and scaling run in an ``ffmpeg`` subprocess built with ffmpeg-python; ``-fps_mode passthrough``
keeps every decoded frame in decode-output (display) order, so files with out-of-order or
variable timestamps lose and gain nothing. Frames are then encoded as baseline JPEG, either
by ffmpeg's ``mjpeg`` encoder (``encoder="mjpeg"``, the default: as fast and ~15% smaller at
equal PSNR thanks to optimal Huffman tables, see benchmarks/bench_preprocess.py) or from raw RGB
with libjpeg-turbo via simplejpeg (``encoder="simplejpeg"``).
Bad input raises :class:`VideoError` with a short reason that ends up in ``errors.parquet``; so does
a video of fewer than :data:`MIN_FRAMES` frames (``too short``): with one frame every clip is that frame,
so the anchor, the Intra-Neg and the AD-Intra-Neg would be one and the same, a contradictory quadruple.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import av
import ffmpeg
import numpy as np
import simplejpeg

# container format names PyAV reports for each extension; a file whose content does not match
# its extension is rejected (a renamed file usually means a broken download or a copy mistake)
EXTENSION_FORMATS: dict[str, tuple[str, ...]] = {
    ".mp4": ("mov", "mp4"),
    ".m4v": ("mov", "mp4"),
    ".mov": ("mov", "mp4"),
    ".3gp": ("mov", "3gp"),
    ".avi": ("avi",),
    ".mkv": ("matroska",),
    ".webm": ("matroska", "webm"),
    ".flv": ("flv",),
    ".mpg": ("mpeg",),
    ".mpeg": ("mpeg",),
    ".ts": ("mpegts",),
    ".wmv": ("asf",),
}
VIDEO_EXTENSIONS = frozenset(EXTENSION_FORMATS)
# fewest frames a kept video has: two frames give a clip and its reverse (the short-video Intra-Neg) that differ
MIN_FRAMES = 2
FFMPEG_TIMEOUT_S = 1800  # per video; a hung ffmpeg becomes an error row instead of a stuck run


class VideoError(Exception):
    """A video that cannot be used; ``str(err)`` is the reason recorded in errors.parquet."""


@dataclass
class Probe:
    """What PyAV says about a file before transcoding."""

    format_name: str
    width: int  # stored (coded) size, before rotation
    height: int
    rotation: int  # degrees, display matrix; 90/-90/270 swap width and height
    fps: float  # average frame rate (0.0 when unknown)
    header_frames: int  # frame count from the container header (0 when unknown)
    duration: float = 0.0  # seconds, from the stream or container header (0.0 when unknown)
    stream_index: int = 0  # index of the chosen video stream in the container (ffmpeg -map 0:i)

    def expected_frames(self, fps: float | None = None) -> tuple[float, float]:
        """(frames the header promises at ``fps`` or natively, how much of it must decode)."""
        if self.header_frames > 0:
            n, share = float(self.header_frames), 0.9
        elif self.duration > 0 and self.fps > 0:  # e.g. Matroska/WebM: no count, a duration
            n, share = self.duration * self.fps, 0.75
        else:
            return 0.0, 0.0
        if fps and self.fps > 0:
            n *= fps / self.fps
        return n, share


@dataclass
class Frames:
    """A transcoded video: JPEG payload plus its frame index."""

    jpgs: bytes
    frame_offsets: list[int]  # num_frames + 1 entries, first 0, last len(jpgs)
    width: int
    height: int
    fps: float

    @property
    def num_frames(self) -> int:
        return len(self.frame_offsets) - 1


def ffmpeg_exe() -> str:
    """The system ``ffmpeg`` if on PATH, else the binary shipped with imageio-ffmpeg."""
    exe = shutil.which("ffmpeg")
    if exe:
        return exe
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def _is_attached_pic(stream) -> bool:
    try:
        return bool(stream.disposition & av.stream.Disposition.attached_pic)
    except (AttributeError, TypeError):
        return False


def probe(path: str | Path) -> Probe:
    """Open ``path`` with PyAV and read its first video stream's geometry, rate and rotation."""
    path = Path(path)
    try:
        container = av.open(str(path), metadata_errors="replace")
    except Exception as e:  # noqa: BLE001 - every PyAV failure means "unreadable"
        raise VideoError(f"unreadable: {type(e).__name__}: {_short(str(e))}") from None
    try:
        fmt = container.format.name or ""
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["no"]
            what = "audio-only" if "audio" in kinds else "no video stream"
            raise VideoError(f"{what}: streams {','.join(kinds)}")
        # the first real video stream: cover art (attached_pic) is a video stream too
        videos = [s for s in container.streams.video if not _is_attached_pic(s)] or list(container.streams.video)
        stream = videos[0]
        ext = path.suffix.lower()
        if ext in EXTENSION_FORMATS and not any(f in fmt.split(",") for f in EXTENSION_FORMATS[ext]):
            raise VideoError(f"wrong extension: {ext} file holds {fmt!r} data; rename it to match its content")
        cc = stream.codec_context
        width, height = int(cc.width or 0), int(cc.height or 0)
        rotation = 0
        try:  # the first frame carries the display matrix (PyAV exposes it as .rotation)
            for frame in container.decode(stream):
                width, height = frame.width, frame.height
                rotation = int(round(getattr(frame, "rotation", 0) or 0))
                break
            else:
                raise VideoError("zero frames: the video stream decodes to nothing")
        except VideoError:
            raise
        except Exception as e:  # noqa: BLE001
            raise VideoError(f"undecodable: {type(e).__name__}: {_short(str(e))}") from None
        if width <= 0 or height <= 0:
            raise VideoError(f"invalid frame size {width}x{height}")
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 0.0
        if stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = float(container.duration or 0) / av.time_base
        return Probe(fmt, width, height, rotation, fps, int(stream.frames or 0), duration, stream.index)
    finally:
        container.close()


def output_size(width: int, height: int, rotation: int, short_side: int | None) -> tuple[int, int]:
    """Displayed (rotation-applied) size scaled so the short side is ``short_side``; both even."""
    if rotation % 180 != 0:
        width, height = height, width
    if not short_side:
        return max(2, width // 2 * 2), max(2, height // 2 * 2)
    s = short_side // 2 * 2
    if width <= height:
        return s, max(2, int(round(height * s / width / 2)) * 2)
    return max(2, int(round(width * s / height / 2)) * 2), s


def _short(msg: str, n: int = 200) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def split_jpegs(data: bytes) -> list[int]:
    """Byte offsets of each JPEG in a concatenation (``len+1`` entries), parsing markers.

    Walks each image's segments (SOI, length-prefixed headers, SOS) and then looks for EOI in
    the entropy-coded data, where 0xFF is always followed by 0x00 or a restart marker; so an
    0xFFD8 / 0xFFD9 pair inside a header (EXIF thumbnail, comment) is never mistaken for a frame.
    """
    offsets = [0]
    pos, n = 0, len(data)
    while pos < n:
        if data[pos : pos + 2] != b"\xff\xd8":
            raise VideoError(f"corrupt JPEG stream at byte {pos}")
        p = pos + 2
        while True:  # header segments
            while p < n and data[p] == 0xFF and p + 1 < n and data[p + 1] == 0xFF:
                p += 1  # fill bytes
            if p + 4 > n or data[p] != 0xFF:
                raise VideoError(f"corrupt JPEG header at byte {p}")
            marker = data[p + 1]
            seg_len = int.from_bytes(data[p + 2 : p + 4], "big")
            p += 2 + seg_len
            if marker == 0xDA:  # SOS: entropy-coded data follows
                break
        end = data.find(b"\xff\xd9", p)
        if end < 0:
            raise VideoError("truncated JPEG stream")
        pos = end + 2
        offsets.append(pos)
    return offsets


def mjpeg_qscale(quality: int) -> int:
    """libjpeg-style quality -> ffmpeg ``-q:v`` with about the same PSNR (measured: 90 -> 2, 85 -> 3, 75 -> 5)."""
    return int(min(31, max(2, round(2 + (90 - quality) / 5))))


def _run_ffmpeg(path: Path, out_kwargs: dict, threads: int = 0, stream_index: int | None = None) -> bytes:
    """Run ffmpeg on one video stream of ``path`` (default: the first) -> stdout bytes (``threads`` 0 = auto)."""
    in_kwargs = {"threads": threads} if threads else {}
    if threads:
        out_kwargs = {**out_kwargs, "threads": threads, "filter_threads": threads}
    src = ffmpeg.input(str(path), **in_kwargs)
    src = src["v:0"] if stream_index is None else src[str(stream_index)]
    stream = ffmpeg.output(src, "pipe:", **out_kwargs)
    cmd = [ffmpeg_exe(), "-nostdin", "-v", "error", *stream.get_args()]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=FFMPEG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise VideoError(f"ffmpeg timed out after {FFMPEG_TIMEOUT_S} s (a stuck decoder or a huge file)") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise VideoError(f"ffmpeg failed: {_short(err[-1] if err else 'exit ' + str(proc.returncode))}")
    return proc.stdout


def transcode(
    path: str | Path,
    short_side: int | None = 128,
    fps: float | None = None,
    quality: int = 90,
    encoder: str = "mjpeg",
    min_frames: int = MIN_FRAMES,
    threads: int = 0,
) -> Frames:
    """Decode ``path`` (video stream only), scale to ``short_side``, optionally resample to ``fps``.

    Rotation metadata is applied by ffmpeg (autorotate); with ``fps=None`` every decoded frame is
    kept. A file that decodes to clearly fewer frames than its header promises (frame count, or
    duration x rate when there is no count) is rejected as truncated. ``threads`` caps ffmpeg's
    threads (0 = ffmpeg's choice; ``preprocess`` gives each pool worker its share of the cores).
    """
    path = Path(path)
    if encoder not in ("simplejpeg", "mjpeg"):
        raise ValueError(f"unknown JPEG encoder {encoder!r}; use 'simplejpeg' or 'mjpeg'")
    if not 1 <= quality <= 100:
        raise ValueError(f"jpeg quality {quality} out of range; use 1..100")
    info = probe(path)
    width, height = output_size(info.width, info.height, info.rotation, short_side)
    filters = []
    if fps:
        filters.append(f"fps={fps}")
    filters.append(f"scale={width}:{height}:flags=area")
    common = {"vf": ",".join(filters), "an": None, "sn": None, "dn": None}
    if not fps:
        common["fps_mode"] = "passthrough"
    if encoder == "mjpeg":
        data = _run_ffmpeg(path, {**common, "f": "image2pipe", "c:v": "mjpeg", "q:v": mjpeg_qscale(quality),
                                  "pix_fmt": "yuvj420p", "strict": -1}, threads, info.stream_index)
        offsets = split_jpegs(data) if data else [0]
        jpgs = data
    else:
        raw = _run_ffmpeg(path, {**common, "f": "rawvideo", "pix_fmt": "rgb24"}, threads, info.stream_index)
        frame_bytes = width * height * 3
        if len(raw) % frame_bytes:
            raise VideoError(f"ffmpeg returned {len(raw)} bytes, not a whole number of {width}x{height} frames")
        frames = np.frombuffer(raw, np.uint8).reshape(-1, height, width, 3)
        parts, offsets = [], [0]
        for f in frames:
            j = simplejpeg.encode_jpeg(f, quality=quality, colorspace="RGB", colorsubsampling="420")
            parts.append(j)
            offsets.append(offsets[-1] + len(j))
        jpgs = b"".join(parts)
    n = len(offsets) - 1
    if n == 0:
        raise VideoError("zero frames: decoded 0 frames")
    if n < min_frames:
        raise VideoError(f"too short: {n} frame(s), fewer than the {min_frames} a training clip needs (with one "
                         "frame its motion-disturbed Intra-Negs equal the anchor)")
    expected, share = info.expected_frames(fps)
    if expected > 10 and n < share * expected - 1:
        raise VideoError(f"truncated: decoded {n} of the {expected:.0f} frames its header promises")
    return Frames(jpgs, offsets, width, height, float(fps) if fps else info.fps)
