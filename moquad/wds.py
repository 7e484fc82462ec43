"""A split's shards as a webdataset pipeline of ``(frames, label)``: for users' own supervised pipelines.

moquad's loaders read samples by offset through the manifest (:mod:`moquad.data.store`); the shards
stay plain webdataset tars, and this is the ready-made way to stream them with webdataset instead
(sequential reads, shard and sample shuffling, DataLoader workers splitting the shards)::

    from moquad.wds import stream
    pipe = stream("data/ucf101", "train", frames=lambda n: range(0, min(n, 32), 2), shuffle=1000)
    for frames, label in pipe:      # frames: uint8 numpy (T, H, W, 3) RGB; label: int (dataset.json classes)
        ...
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=4)   # workers split the shards

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

from moquad.data.store import decode_frames, read_manifest

Frames = Callable[[int], Sequence[int]]  # a video's frame count -> the indices of the frames to decode


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


def stream(data_dir: str | Path, split: str, *, frames: Frames | None = None, shuffle: int = 0, seed: int = 0,
           by_node: bool = False) -> wds.WebDataset:
    """A webdataset pipeline over ``split``'s shards yielding ``(frames, label)`` per video.

    ``frames(num_frames)`` picks the frames to decode (all of them when None: a long video is large);
    ``shuffle`` > 0 shuffles the shard order and the videos in a buffer of that many, seeded by ``seed``
    (the same order on every run); 0 yields the videos in shard order. ``by_node``: each torch.distributed
    rank streams its own share of the shards (webdataset's ``split_by_node``); DataLoader workers always
    split the shards among themselves.
    """
    if shuffle < 0:
        raise ValueError(f"shuffle={shuffle}: use 0 (shard order) or a buffer size such as 1000")
    urls = shard_urls(data_dir, split)
    pipe = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, seed=seed, detshuffle=bool(shuffle),
                          nodesplitter=wds.split_by_node if by_node else wds.single_node_only, empty_check=False)
    if shuffle:
        pipe = pipe.shuffle(shuffle, seed=seed)
    return pipe.map(_decoder(frames))
