"""Cross-shard donor pool for RAD-inter: frames of OTHER videos to fill the noise-image windows.

Each loader worker owns one pool, fed by an independent stream of tar samples over the split's
shards in a different order than the main stream (its own seed), so donors are uncorrelated with
the shard being read and rarely come from it. The donor stream reads each sample's JSON and then
seeks to just the ``per_video`` random frames it needs (the frame index makes that possible), so it
costs two small reads and two JPEG decodes per video instead of a second full read of the data.
The pool is a ring buffer of ``capacity`` frames (default 256) stored at the RAD window size;
after every main sample one more donor video is pulled, which keeps the pool fresh. A donor is
never drawn from the video being disturbed: entries carry their video id and
:meth:`DonorPool.draw` excludes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from moquad.data.disturb import resize_donors
from moquad.data.frames import decode_jpeg
from moquad.data.tarread import tar_members

Donor = tuple[str, list[bytes]]  # (video id, JPEG bytes of a few of its frames)


def donor_stream(urls: Iterator[dict[str, Any]], rng: np.random.Generator, per_video: int = 2) -> Iterator[Donor]:
    """Stage: shard items ``{"url"}`` -> ``(video_id, [JPEG bytes of per_video random frames])``."""
    for item in urls:
        with open(item["url"], "rb") as f:
            meta, key = None, None
            for member, offset, size in tar_members(f, item["url"]):
                name, _, ext = member.rpartition("/")[2].partition(".")
                if ext == "json":
                    f.seek(offset)
                    meta, key = json.loads(f.read(size)), name
                elif ext == "jpgs" and meta is not None and name == key:
                    offsets = meta["frame_offsets"]
                    n = len(offsets) - 1
                    frames = []
                    for i in rng.choice(n, size=min(per_video, n), replace=False):
                        f.seek(offset + offsets[i])
                        frames.append(f.read(offsets[i + 1] - offsets[i]))
                    yield str(meta["video_id"]), frames
                    meta = None


class DonorPool:
    """Ring buffer of donor frames uint8 (cell, cell, 3) with the id of the video each came from."""

    def __init__(self, donors: Iterator[Donor], capacity: int, cell: int) -> None:
        if capacity < 1:
            raise ValueError(f"donor_pool must be >= 1, got {capacity}")
        self.donors = donors
        self.capacity = capacity
        self.cell = cell
        self.frames = torch.zeros((capacity, cell, cell, 3), dtype=torch.uint8)
        self.ids = np.full(capacity, "", dtype=object)
        self.keys = np.zeros(capacity, dtype=np.int64)  # hash(id): excluding a video is an integer compare
        self.size = 0
        self._next = 0

    def add(self, video_id: str, frames: torch.Tensor) -> None:
        """Insert donor frames uint8 (N, cell, cell, 3), replacing the oldest entries."""
        for f in frames:
            self.frames[self._next] = f
            self.ids[self._next] = video_id
            self.keys[self._next] = hash(video_id)
            self._next = (self._next + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def pull(self, videos: int = 1) -> None:
        """Read ``videos`` more videos from the donor stream and add their frames."""
        for _ in range(videos):
            try:
                video_id, jpegs = next(self.donors)
            except StopIteration:
                raise RuntimeError("the donor stream ended; it must cycle over the shards") from None
            frames = torch.from_numpy(np.stack([decode_jpeg(j) for j in jpegs]))
            self.add(video_id, resize_donors(frames, self.cell))

    def fill(self, max_videos: int | None = None) -> None:
        """Pull until the pool is full (at most ``max_videos`` videos; default enough to fill it)."""
        limit = max_videos if max_videos is not None else self.capacity
        pulled = 0
        while self.size < self.capacity and pulled < limit:
            self.pull(1)
            pulled += 1

    def draw(self, count: int, exclude: str, rng: np.random.Generator) -> tuple[torch.Tensor, list[str]]:
        """``count`` donor frames (with replacement) from videos other than ``exclude``, and their ids."""
        if self.size == 0:
            self.fill()
        key = hash(exclude)  # (a hash collision could only exclude one more video, never admit this one)
        candidates = np.flatnonzero(self.keys[: self.size] != key)
        tries = 0
        while len(candidates) == 0 and tries < 4 * self.capacity:  # pool holds only this video: read on
            self.pull(1)
            tries += 1
            candidates = np.flatnonzero(self.keys[: self.size] != key)
        if len(candidates) == 0:
            raise ValueError(
                "RAD-inter needs donor frames from other videos but the split has only one video; "
                "use appearance_op=rad_intra or add videos"
            )
        pick = candidates[rng.integers(0, len(candidates), size=count)]
        return torch.from_numpy(self.frames.numpy()[pick]), self.ids[pick].tolist()  # numpy take: 8x less overhead
