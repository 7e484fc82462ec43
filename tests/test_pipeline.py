"""Loader pipeline: batch contract, determinism, epoch reshuffle, rank split in a real gloo group."""

from __future__ import annotations

import dataclasses
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moquad.config import LoaderConfig
from moquad.data.augment import STD, normalize
from moquad.data.pipeline import batches_per_epoch, make_loader
from moquad.data.testing import coded_dataset

CFG = LoaderConfig(frames=4, size=16, dilations=(1, 2), workers=0, shuffle_buffer=4, donor_pool=8)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return coded_dataset(tmp_path_factory.mktemp("pipe"), num_videos=12, num_frames=24, videos_per_shard=2)


def _ids(loader) -> list[str]:
    return [vid for batch in loader for vid in batch["video_id"]]


def test_batches_per_epoch(data):
    assert batches_per_epoch(data, "train", 4) == 3
    assert batches_per_epoch(data, "train", 5) == 2
    assert batches_per_epoch(data, "train", 64) == 1
    with pytest.raises(ValueError):
        batches_per_epoch(data, "train", 0)


@pytest.mark.parametrize(
    "changes, names",
    [
        ({}, ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")),
        ({"intra_neg": False, "ad_intra_neg": False}, ("anchor", "ad_pos")),
        ({"ad_intra_neg": False}, ("anchor", "ad_pos", "intra_neg")),
        ({"ad_pos": False}, ("anchor", "pos", "intra_neg", "ad_intra_neg")),
        ({"mode": "simclr"}, ("clip1", "clip2")),
        ({"mode": "appearance"}, ("clip_n", "clip_m")),
    ],
)
def test_batch_contract(data, changes, names):
    cfg = dataclasses.replace(CFG, **changes)
    loader = make_loader(data, cfg, batch_size=3, num_batches=2, debug=True)
    assert len(loader) == 2
    batches = list(loader)
    assert len(batches) == 2
    b = batches[0]
    v = len(names)
    assert b["view_names"] == names
    assert b["views"].dtype == torch.uint8 and b["views"].shape == (3, v, 3, 4, 16, 16)
    assert b["label"].dtype == torch.int64 and b["label"].tolist() == [int(i[1:]) % 4 for i in b["video_id"]]
    assert b["lam"].dtype == torch.float32 and b["lam"].shape == (3, v)
    disturbed = torch.tensor([n.startswith("ad_") for n in names])
    assert torch.all((b["lam"] > 0) == disturbed)
    for info in b["info"]:
        n, m = info["dilations"]
        steps = [set(np.diff(np.asarray(i)).tolist()) for i in info["indices"]]
        if cfg.mode == "simclr":
            assert steps == [{cfg.simclr_dilation}] * 2
        elif cfg.mode == "appearance":
            assert steps == [{n}, {m}] and n != m


def test_same_seed_same_batches_new_epoch_new_order(data):
    for workers in (0, 2):
        cfg = dataclasses.replace(CFG, workers=workers)
        a = list(make_loader(data, cfg, batch_size=2, num_batches=4))
        b = list(make_loader(data, cfg, batch_size=2, num_batches=4))
        assert [x["video_id"] for x in a] == [x["video_id"] for x in b]
        assert all(torch.equal(x["views"], y["views"]) and torch.equal(x["lam"], y["lam"]) for x, y in zip(a, b))
    e0 = _ids(make_loader(data, CFG, batch_size=2, num_batches=6, epoch=0))
    e1 = _ids(make_loader(data, CFG, batch_size=2, num_batches=6, epoch=1))
    s1 = _ids(make_loader(data, dataclasses.replace(CFG, seed=1), batch_size=2, num_batches=6))
    assert e0 != e1 and e0 != s1


def test_one_epoch_visits_every_video_once(data):
    cfg = dataclasses.replace(CFG, shuffle_buffer=1, workers=2)
    ids = _ids(make_loader(data, cfg, batch_size=2, num_batches=batches_per_epoch(data, "train", 2)))
    assert sorted(ids) == [f"v{i:02d}" for i in range(12)]


def test_exact_length_by_cycling(data):
    ids = _ids(make_loader(data, dataclasses.replace(CFG, workers=2), batch_size=4, num_batches=7))
    assert len(ids) == 28 and set(ids) == {f"v{i:02d}" for i in range(12)}


def test_few_shards_split_per_video(tmp_path):
    data = coded_dataset(tmp_path, num_videos=9, num_frames=12, videos_per_shard=9)  # one shard
    cfg = dataclasses.replace(CFG, workers=2)
    seen = [_ids(make_loader(data, cfg, batch_size=2, num_batches=2, rank=r, world_size=2)) for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 4
    assert not set(seen[0]) & set(seen[1])


def test_errors(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="preprocess"):
        make_loader(tmp_path, CFG, batch_size=2)
    with pytest.raises(ValueError, match="mode"):
        make_loader(data, dataclasses.replace(CFG, mode="byol"), batch_size=2)
    with pytest.raises(ValueError, match="appearance_op"):
        make_loader(data, dataclasses.replace(CFG, appearance_op="mixup"), batch_size=2)
    with pytest.raises(ValueError, match="rank"):
        make_loader(data, CFG, batch_size=2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="two different"):
        make_loader(data, dataclasses.replace(CFG, dilations=(2,)), batch_size=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, data: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = dataclasses.replace(CFG, workers=2)
        try:  # a loader that ignores the group would duplicate data: refused
            make_loader(data, cfg, batch_size=2)
            refused = False
        except ValueError:
            refused = True
        loader = make_loader(data, cfg, batch_size=2, rank=rank, world_size=2)
        batches = list(loader)
        mine = {"count": len(batches), "ids": [v for b in batches for v in b["video_id"]], "refused": refused}
        gathered: list = [None, None]
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            out.update({"ranks": gathered})
    finally:
        dist.destroy_process_group()


def test_two_ranks_in_a_gloo_group_see_disjoint_videos(data):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_main, args=(_free_port(), str(data), out), nprocs=2, join=True)
        r0, r1 = out["ranks"]
    assert r0["refused"] and r1["refused"]
    assert r0["count"] == r1["count"] == batches_per_epoch(data, "train", 4) == 3
    assert len(r0["ids"]) == len(r1["ids"]) == 6
    assert not set(r0["ids"]) & set(r1["ids"])  # disjoint videos


def test_colour_on_device_matches_the_worker_colour_jitter(data):
    cfg = dataclasses.replace(CFG, color_jitter=1.0, grayscale=0.3, size=24)
    cpu = next(iter(make_loader(data, cfg, batch_size=3, num_batches=1)))
    dev = next(iter(make_loader(data, cfg, batch_size=3, num_batches=1, colour_on_device=True)))
    assert "colour" not in cpu and dev["colour"].shape == (3, 4, 3, 4)
    assert dev["video_id"] == cpu["video_id"] and torch.equal(dev["lam"], cpu["lam"])
    a = normalize(cpu["views"], "cpu")
    b = normalize(dev["views"], "cpu", colour=dev["colour"])
    plain = [i for i, n in enumerate(cpu["view_names"]) if not n.startswith("ad_")]  # RAD views differ in order
    assert (a[:, plain] - b[:, plain]).abs().max() < 0.6 / 255 / min(STD)  # only the uint8 rounding differs
    assert not torch.equal(dev["views"], cpu["views"])  # the workers really skipped the colour map


@pytest.fixture(scope="module")
def preprocessed(synth_root, tmp_path_factory):
    """The lead's synthetic UCF101-layout videos through the real preprocess (3 shards per split)."""
    from moquad.config import PreprocessConfig
    from moquad.preprocess.run import preprocess

    out = tmp_path_factory.mktemp("prep")
    preprocess(PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(out), short_side=32, workers=1,
                                shard_size=60_000))
    return out


def test_real_shards_give_the_manifest_frames_and_labels(preprocessed):
    import pyarrow.parquet as pq

    from moquad.data.frames import read_frames

    rows = {r["video_id"]: r for r in pq.read_table(preprocessed / "manifests" / "train.parquet").to_pylist()}
    cfg = dataclasses.replace(CFG, frames=6, size=32, crop_scale=(1.0, 1.0), flip=False, color_jitter=0.0,
                              grayscale=0.0, workers=2, dilations=(1, 3))
    seen = []
    for rank in (0, 1):
        loader = make_loader(preprocessed, cfg, batch_size=2, rank=rank, world_size=2, debug=True)
        batches = list(loader)
        assert len(batches) == batches_per_epoch(preprocessed, "train", 4)
        ids = [v for b in batches for v in b["video_id"]]
        seen.append(set(ids))
        for b in batches:
            for i, vid in enumerate(b["video_id"]):
                r = rows[vid]
                assert b["label"][i] == r["label"]
                for v in (0, 2):  # anchor, intra_neg: plain clips = the frames read straight from the shard
                    idx = b["info"][i]["indices"][v]
                    ref = read_frames(preprocessed / r["shard"], r["jpgs_offset"], r["frame_offsets"], idx)
                    got = b["views"][i, v].permute(1, 2, 3, 0).numpy()  # (T, H, W, 3)
                    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1
    assert not seen[0] & seen[1]
