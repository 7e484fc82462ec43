"""Cross-shard donor pool: exclusion of the current video, ring-buffer freshness, cross-shard reach."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from moquad.config import LoaderConfig
from moquad.data.donors import DonorPool, donor_stream
from moquad.data.frames import decode_jpeg
from moquad.data.pipeline import make_loader
from moquad.data.testing import coded_dataset, coded_video, decode_code


def _stream(videos, per_video=2):
    """Endless donor items like ``donor_stream`` yields: (video id, JPEG bytes of a few frames)."""
    import simplejpeg

    items = []
    for v in videos:
        jpegs = [simplejpeg.encode_jpeg(f, quality=95) for f in coded_video(v, per_video, 16, 16)]
        items.append((f"v{v:02d}", jpegs))
    while True:
        yield from items


def test_draw_never_returns_the_excluded_video():
    pool = DonorPool(_stream([0, 0, 0, 1]), capacity=8, cell=4)
    pool.fill()
    assert pool.size == 8 and set(pool.ids) == {"v00", "v01"}
    rng = np.random.default_rng(1)
    for _ in range(20):
        frames, ids = pool.draw(25, "v00", rng)
        assert ids == ["v01"] * 25 and frames.shape == (25, 4, 4, 3) and frames.dtype == torch.uint8
        assert torch.all((frames[..., 0].float() - 30).abs() <= 1)  # red code of video 1: the pixels agree


def test_pool_reads_on_when_it_only_holds_the_current_video():
    pool = DonorPool(_stream([5, 5, 5, 5, 7], per_video=1), capacity=4, cell=4)
    pool.fill()
    assert set(pool.ids) == {"v05"}
    _, ids = pool.draw(3, "v05", np.random.default_rng(0))
    assert ids == ["v07"] * 3


def test_single_video_is_a_clear_error():
    pool = DonorPool(_stream([2]), capacity=4, cell=4)
    with pytest.raises(ValueError, match="rad_intra"):
        pool.draw(1, "v02", np.random.default_rng(0))


def test_ring_buffer_replaces_the_oldest():
    pool = DonorPool(_stream(list(range(6))), capacity=4, cell=4)
    pool.pull(4)  # 8 frames into 4 slots: only the last two videos remain
    assert pool.size == 4 and sorted(set(pool.ids)) == ["v02", "v03"]


def test_donor_stream_reads_the_chosen_frames(tmp_path):
    data = coded_dataset(tmp_path, num_videos=3, num_frames=10, videos_per_shard=3)
    urls = iter([{"url": str(p)} for p in sorted((data / "shards").glob("*.tar"))])
    items = list(donor_stream(urls, np.random.default_rng(0), per_video=3))
    assert [vid for vid, _ in items] == ["v00", "v01", "v02"]
    for vid, jpegs in items:
        codes = [decode_code(decode_jpeg(j)[4, 4]) for j in jpegs]
        assert len(set(codes)) == 3 and all(c[0] == int(vid[1:]) and 0 <= c[1] < 10 for c in codes)


def test_donors_cross_shards_and_ranks(tmp_path):
    """The donor stream covers all shards: rank 0 draws donors from videos only rank 1 trains on."""
    data = coded_dataset(tmp_path, num_videos=8, num_frames=20, videos_per_shard=2)
    cfg = LoaderConfig(frames=4, size=20, workers=0, shuffle_buffer=2, donor_pool=8, dilations=(1, 2))
    own, donors = set(), set()
    for batch in make_loader(data, cfg, batch_size=2, num_batches=4, rank=0, world_size=2, debug=True):
        own |= set(batch["video_id"])
        for vid, info in zip(batch["video_id"], batch["info"]):
            for ids in info["donor_ids"]:
                assert vid not in ids
                donors |= set(ids)
    assert own and donors - own  # donors from outside this rank's shards
    assert len(donors) >= 4


def test_no_donor_stream_without_rad_inter(tmp_path, monkeypatch):
    data = coded_dataset(tmp_path, num_videos=4, num_frames=20, videos_per_shard=2)
    calls = []
    monkeypatch.setattr(DonorPool, "pull", lambda self, videos=1: calls.append(videos))
    for op in ("rad_intra", "be", "none"):
        cfg = dataclasses.replace(LoaderConfig(frames=4, size=20, workers=0, dilations=(1, 2)), appearance_op=op)
        assert len(list(make_loader(data, cfg, batch_size=2, num_batches=1))) == 1
    assert calls == []
