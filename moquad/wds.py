"""A split's shards as a webdataset pipeline of ``(frames, label)``: for users' own supervised pipelines.

moquad's loaders read samples by offset through the manifest (:mod:`moquad.data.store`); the shards
stay plain webdataset tars, and this is the ready-made way to stream them with webdataset instead
(sequential reads, shard and sample shuffling, DataLoader workers splitting the shards)::

    from moquad.wds import stream
    pipe = stream("data/ucf101", "train", frames=16, shuffle=1000)   # the centred 16-frame clip of each video
    for frames, label in pipe:      # frames: uint8 numpy (T, H, W, 3) RGB; label: int (dataset.json classes)
        ...
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=4)   # workers split the shards
    every_other = stream("data/ucf101", "train", frames=lambda n: range(0, min(n, 32), 2))  # any frame choice

``frames=N`` is moquad's clip rule (:func:`moquad.data.clip_frames.uniform_clips`): N consecutive frames from the
middle of the video; a video shorter than N is stretched to N (frames repeated evenly), so every sample has N.

The shards streamed are the ones the split's manifest names (the manifest is the index, as everywhere
in moquad). Checksums are not checked here: ``moquad verify DIR`` checks every shard.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds

from moquad.data.clip_frames import uniform_clips
from moquad.data.store import decode_frames, read_manifest

Frames = Callable[[int], Sequence[int]]  # a video's frame count -> the indices of the frames to decode


def _frame_rule(frames: int | Frames | None) -> Frames | None:
    """``frames`` as a function of a video's frame count: an int N is the centred N-frame clip (the clip rule)."""
    if frames is None or (callable(frames) and not isinstance(frames, type)):
        return frames
    if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0:
        count = frames
        return lambda n: uniform_clips(n, count, 1, 1)[0]
    raise ValueError(f"frames={frames!r}: give a number of frames (frames=16: the centred 16-frame clip), a function "
                     "of the video's frame count returning the indices to decode, or None (every frame)")


def shard_urls(data_dir: str | Path, split: str) -> list[str]:
    """The shards of ``split``, as its manifest names them, sorted (several parts included)."""
    table = read_manifest(data_dir, split)
    return [str(Path(data_dir) / s) for s in sorted(set(table.column("shard").to_pylist()))]


def _decoder(frames: Frames | None) -> Callable[[dict[str, Any]], tuple[np.ndarray, int]]:
    def decode(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
        meta = json.loads(sample["json"])
        n = int(meta["num_frames"])
        indices = range(n) if frames is None else frames(n)
        return decode_frames(sample["jpgs"], meta["frame_offsets"], indices), int(meta["label"])

    return decode


def stream(data_dir: str | Path, split: str, *, frames: int | Frames | None = None, shuffle: int = 0, seed: int = 0,
           by_node: bool = False) -> wds.WebDataset:
    """A webdataset pipeline over ``split``'s shards yielding ``(frames, label)`` per video.

    ``frames``: how many (an int N: the centred N-frame clip, stretched for a shorter video), or a function
    ``frames(num_frames)`` returning the indices to decode, or None (all of them: a long video is large);
    ``shuffle`` > 0 shuffles the shard order and the videos in a buffer of that many, seeded by ``seed``
    (the same order on every run); 0 yields the videos in shard order. ``by_node``: each torch.distributed
    rank streams its own share of the shards (webdataset's ``split_by_node``); DataLoader workers always
    split the shards among themselves.
    """
    pick = _frame_rule(frames)  # checked here: a wrong frames= fails now, not inside webdataset's iterator
    if shuffle < 0:
        raise ValueError(f"shuffle={shuffle}: use 0 (shard order) or a buffer size such as 1000")
    urls = shard_urls(data_dir, split)
    pipe = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, seed=seed, detshuffle=bool(shuffle),
                          nodesplitter=wds.split_by_node if by_node else wds.single_node_only, empty_check=False)
    if shuffle:
        pipe = pipe.shuffle(shuffle, seed=seed)
    return pipe.map(_decoder(pick))
