"""RAD-inter donors: one random frame of random other videos per batch, read by index, other shards first."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from video_fixtures import coded_dataset, decode_code

from moquad.data.donors import DonorPool, donor_picks, donor_pool
from moquad.data.store import Split
from moquad.errors import MoquadError


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    return Split(coded_dataset(tmp_path_factory.mktemp("don"), num_videos=8, num_frames=20, videos_per_shard=2))


def test_pool_reads_one_frame_of_distinct_videos_at_the_window_size(split):
    pool = donor_pool(split, donor_picks(split, 5, np.random.default_rng(0)), 7)
    assert pool.cells.shape == (5, 7, 7, 3) and pool.cells.dtype == torch.uint8
    assert len(set(pool.video.tolist())) == 5 and pool.ids == [f"v{i:02d}" for i in pool.video]
    for cell, vid in zip(pool.cells, pool.video):
        video, frame = decode_code(cell.float().mean(dim=(0, 1)).numpy())  # the pixels are that video's frame
        assert video == vid and 0 <= frame < 20
    largest = sum(int(np.diff(split.frame_offsets(int(v))).max()) for v in pool.video)
    smallest = sum(int(np.diff(split.frame_offsets(int(v))).min()) for v in pool.video)
    assert smallest <= pool.bytes_read <= largest  # exactly one frame read per donor
    again = donor_pool(split, donor_picks(split, 5, np.random.default_rng(0)), 7)
    assert torch.equal(again.cells, pool.cells)  # seeded
    assert len(donor_pool(split, donor_picks(split, 100, np.random.default_rng(1)), 7).video) == 8  # capped at the split


def _pool(videos, shards) -> DonorPool:
    n = len(videos)
    return DonorPool(torch.zeros((n, 3, 3, 3), dtype=torch.uint8), np.asarray(videos), np.asarray(shards),
                     [f"v{v}" for v in videos])


def test_picker_prefers_other_shards_and_never_the_own_video():
    rng = np.random.default_rng(0)
    pool = _pool([0, 1, 2, 3, 4], [0, 0, 1, 1, 2])
    chosen, ids = pool.picker(video=1, shard=0)(3, rng)
    assert sorted(chosen.tolist()) == [2, 3, 4] and ids == [f"v{c}" for c in chosen]  # distinct, other shards
    chosen, ids = pool.picker(video=1, shard=0)(4, rng)
    assert sorted(chosen.tolist()) == [0, 2, 3, 4]  # then other videos of its shard, never its own
    chosen, _ = pool.picker(video=1, shard=0)(200, rng)
    assert set(chosen.tolist()) == {0, 2, 3, 4} and len(chosen) == 200  # a small pool repeats donors
    chosen, _ = _pool([0, 1, 2], [0, 0, 0]).picker(video=1, shard=0)(100, rng)
    assert set(chosen.tolist()) == {0, 2}  # one shard: any other video
    with pytest.raises(MoquadError, match="rad_intra"):
        _pool([1], [0]).picker(video=1, shard=0)


@pytest.fixture(scope="module")
def solid(tmp_path_factory):
    """24 videos of one flat colour each (coded_video: R = 20 + 10 * video), 6 shards."""
    return coded_dataset(tmp_path_factory.mktemp("solid"), num_videos=24, num_frames=8, videos_per_shard=4)


@pytest.mark.parametrize("k, per_rank, world", [(5, 1, 4), (3, 1, 8), (5, 2, 2), (5, 4, 1)])
def test_a_mosaic_holds_k2_distinct_videos_whatever_the_per_rank_batch(solid, k, per_rank, world):
    """Counted from pixels: with lambda = 1 and no crop / colour / flip an AD view IS the mosaic D; each k x k
    window's centre pixel names its donor video. Needed: min(k*k, videos - 1) distinct videos, none the own."""
    from moquad.config import LoaderConfig
    from moquad.data.pipeline import make_loader

    size = 40 if k == 5 else 30
    cfg = LoaderConfig(frames=4, size=size, rad_k=k, rad_lambda=(1.0, 1.0), crop_scale=(1.0, 1.0), flip="none",
                       color_jitter=0.0, grayscale=0.0, workers=0)
    need, c = min(k * k, 24 - 1), size // k
    seen = 0
    for rank in range(min(world, 2)):
        for batch in make_loader(solid, cfg, batch_size=per_rank, world_size=world, rank=rank):
            views = batch["views"]  # (B, V, 3, T, S, S) uint8
            for b, own in enumerate(batch["index"].tolist()):
                for v, name in enumerate(batch["view_names"]):
                    if not name.startswith("ad_"):
                        continue
                    centres = views[b, v, :, 0, c // 2 :: c, c // 2 :: c].reshape(3, -1).T.numpy()
                    donors = {decode_code(p)[0] for p in centres}
                    assert own not in donors and donors <= set(range(24))
                    assert len(donors) >= need, (len(donors), need)
                    seen += 1
    assert seen >= 4
