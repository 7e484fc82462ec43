"""Frames of a user's video file, decoded with PyAV outside preprocessing (``moquad cam``, ``moquad synth --kind
camera``): the one place that says what is wrong with a file that is not a readable video.

Preprocessing records such a file in ``manifests/errors.parquet``; here it is :class:`UnreadableVideo`, a one-line
error that names the file and what to do (unreadable, truncated, or a container without a video stream).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from moquad.errors import MoquadError


class UnreadableVideo(MoquadError):
    """A file that is not a readable video; the message names it and says what to do."""


def unreadable(path: str | Path, why: str) -> UnreadableVideo:
    """The one-line error of a file that is not a readable video, with what to do about it."""
    return UnreadableVideo(f"{path}: not a readable video ({why}); check that it plays (ffprobe {path}) or "
                           f"re-encode it (ffmpeg -i {path} -c:v libx264 {Path(path).stem}_fixed.mp4), then pass that file")


def decode_frames(path: str | Path, convert: Callable[[Any], np.ndarray], limit: int | None = None) -> np.ndarray:
    """Every frame of ``path``'s first video stream in decode order (at most ``limit``), each ``convert(frame)``
    (a PyAV VideoFrame -> (H, W, 3) uint8) -> (T, H, W, 3). :class:`UnreadableVideo` for a file PyAV cannot open,
    one without a video stream, one whose data breaks off (truncated) and one with no decodable frame.

    >>> decode_frames("clip.mp4", lambda f: f.to_ndarray(format="rgb24"))  # doctest: +SKIP
    """
    import av

    frames: list[np.ndarray] = []
    try:
        with av.open(str(path), metadata_errors="replace") as container:
            if not container.streams.video:
                raise unreadable(path, "no video stream")
            for frame in container.decode(video=0):
                frames.append(convert(frame))
                if limit is not None and len(frames) >= limit:
                    break
    except av.error.FFmpegError as e:
        said = " ".join(str(getattr(e, "strerror", None) or e).split())[:100]
        raise unreadable(path, f"{said}{' after ' + str(len(frames)) + ' frames' if frames else ''}") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise unreadable(path, f"{type(e).__name__}: {' '.join(str(e).split())[:100]}") from e
    if not frames:
        raise unreadable(path, "no decodable video frames")
    return np.stack(frames)
