"""RAD-inter donors: one random frame of random other videos per batch, read by index, other shards first."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import coded_dataset, decode_code

from moquad.data.donors import DonorPool, donor_pool
from moquad.data.store import Split
from moquad.errors import MoquadError


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    return Split(coded_dataset(tmp_path_factory.mktemp("don"), num_videos=8, num_frames=20, videos_per_shard=2))


def test_pool_reads_one_frame_of_distinct_videos_at_the_window_size(split):
    pool = donor_pool(split, 5, 7, np.random.default_rng(0))
    assert pool.cells.shape == (5, 7, 7, 3) and pool.cells.dtype == torch.uint8
    assert len(set(pool.video.tolist())) == 5 and pool.ids == [f"v{i:02d}" for i in pool.video]
    for cell, vid in zip(pool.cells, pool.video):
        video, frame = decode_code(cell.float().mean(dim=(0, 1)).numpy())  # the pixels are that video's frame
        assert video == vid and 0 <= frame < 20
    largest = sum(int(np.diff(split.frame_offsets(int(v))).max()) for v in pool.video)
    smallest = sum(int(np.diff(split.frame_offsets(int(v))).min()) for v in pool.video)
    assert smallest <= pool.bytes_read <= largest  # exactly one frame read per donor
    again = donor_pool(split, 5, 7, np.random.default_rng(0))
    assert torch.equal(again.cells, pool.cells)  # seeded
    assert len(donor_pool(split, 100, 7, np.random.default_rng(1)).video) == 8  # capped at the split


def _pool(videos, shards) -> DonorPool:
    n = len(videos)
    return DonorPool(torch.zeros((n, 3, 3, 3), dtype=torch.uint8), np.asarray(videos), np.asarray(shards),
                     [f"v{v}" for v in videos])


def test_picker_prefers_other_shards_and_never_the_own_video():
    rng = np.random.default_rng(0)
    pool = _pool([0, 1, 2, 3, 4], [0, 0, 1, 1, 2])
    chosen, ids = pool.picker(video=1, shard=0)(200, rng)
    assert set(chosen.tolist()) == {2, 3, 4} and len(ids) == 200  # other shards only
    chosen, _ = _pool([0, 1, 2], [0, 0, 0]).picker(video=1, shard=0)(100, rng)
    assert set(chosen.tolist()) == {0, 2}  # one shard: any other video
    with pytest.raises(MoquadError, match="rad_intra"):
        _pool([1], [0]).picker(video=1, shard=0)
