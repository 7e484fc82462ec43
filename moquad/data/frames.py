"""Decode frames of one video from its concatenated JPEG payload (``.jpgs``).

The manifest's ``frame_offsets`` has ``num_frames + 1`` entries: frame ``i`` is the byte
range ``[frame_offsets[i], frame_offsets[i+1])`` of the payload. Only the frames a clip
needs are decoded. ``read_frames`` seeks straight into a shard (``jpgs_offset`` is the
payload's byte offset inside the tar), so evaluation never scans a shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import simplejpeg


def decode_jpeg(data: bytes | memoryview) -> np.ndarray:
    """One JPEG -> uint8 array (H, W, 3), RGB."""
    return simplejpeg.decode_jpeg(bytes(data) if isinstance(data, memoryview) else data, colorspace="RGB")


def decode_frames(jpgs: bytes, frame_offsets: Sequence[int], indices: Sequence[int]) -> np.ndarray:
    """Decode ``indices`` (any order, repeats allowed) -> uint8 array (T, H, W, 3).

    A frame used twice is decoded once.
    """
    n = len(frame_offsets) - 1
    view = memoryview(jpgs)
    cache: dict[int, np.ndarray] = {}
    out = []
    for i in indices:
        i = int(i)
        if not 0 <= i < n:
            raise IndexError(f"frame {i} out of range for a video of {n} frames")
        if i not in cache:
            cache[i] = decode_jpeg(view[frame_offsets[i] : frame_offsets[i + 1]])
        out.append(cache[i])
    return np.stack(out)


def read_frames(
    shard: str | Path, jpgs_offset: int, frame_offsets: Sequence[int], indices: Sequence[int]
) -> np.ndarray:
    """Read and decode ``indices`` of one video straight from its shard by byte offsets."""
    wanted = sorted(set(int(i) for i in indices))
    n = len(frame_offsets) - 1
    for i in wanted:
        if not 0 <= i < n:
            raise IndexError(f"frame {i} out of range for a video of {n} frames")
    frames: dict[int, np.ndarray] = {}
    with open(shard, "rb") as f:
        for i in wanted:
            f.seek(jpgs_offset + frame_offsets[i])
            frames[i] = decode_jpeg(f.read(frame_offsets[i + 1] - frame_offsets[i]))
    return np.stack([frames[int(i)] for i in indices])
