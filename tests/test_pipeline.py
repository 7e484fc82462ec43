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


# ---------------------------------------------------------------- augment_on_device


def _smooth_video(frames: int, h: int, w: int, seed: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    x = [np.stack([127 + 100 * np.sin(xx / (4 + c) + yy / (6 + 2 * c) + 0.4 * t + seed) for c in range(3)], -1)
         for t in range(frames)]
    return np.stack(x).astype(np.uint8)


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """Smooth textured videos of two frame sizes (batches need padding)."""
    from moquad.data.testing import write_dataset

    videos = [(f"v{i:02d}", _smooth_video(24, *((40, 56) if i % 2 else (48, 44)), i), i % 4) for i in range(6)]
    return write_dataset(tmp_path_factory.mktemp("tex"), videos, videos_per_shard=2)


def _levels(y: torch.Tensor) -> torch.Tensor:
    return y.double() * torch.tensor(STD, dtype=torch.float64).view(3, 1, 1, 1) * 255


@pytest.mark.parametrize("changes", [{}, {"appearance_op": "be"}, {"mode": "simclr"}])
def test_augment_on_device_gives_the_cpu_path_views(textured, changes):
    """Same seed: same clips, crops, flips, colour ops, lambdas and donors as the CPU path; device_augment's
    views differ only by the CPU path's uint8 roundings (crops upscaled here: the same bilinear filter)."""
    from moquad.data.augment import device_augment
    from moquad.data.raw import RAW_KEYS

    cfg = dataclasses.replace(CFG, size=64, color_jitter=0.8, grayscale=0.2, **changes)
    cpu = next(iter(make_loader(textured, cfg, batch_size=3, num_batches=1, debug=True)))
    raw = next(iter(make_loader(textured, dataclasses.replace(cfg, augment_on_device=True), batch_size=3,
                                num_batches=1, debug=True)))
    assert "views" not in raw and set(RAW_KEYS) <= set(raw)
    assert raw["raw"].dtype == torch.uint8 and raw["raw"].shape[2:] == (48, 56, 3)  # padded to the largest frame
    assert raw["view_names"] == cpu["view_names"] and raw["video_id"] == cpu["video_id"]
    assert torch.equal(raw["lam"], cpu["lam"]) and torch.equal(raw["label"], cpu["label"])
    for a, b in zip(cpu["info"], raw["info"]):
        assert a["donor_ids"] == b["donor_ids"] and a["dilations"] == b["dilations"]
        assert all(np.array_equal(x, y) for x, y in zip(a["indices"], b["indices"]))
    out = device_augment(raw, "cpu", cfg.size)
    assert out.dtype == torch.float32 and out.shape == (3, len(cpu["view_names"]), 3, 4, 64, 64)
    diff = (_levels(out) - _levels(normalize(cpu["views"], "cpu"))).abs()
    assert diff.mean() < 0.6 and diff.max() < 5  # measured: mean 0.3, max 1.9 (3.5 with BE), in levels of 255


def test_augment_on_device_is_deterministic(textured):
    from moquad.data.augment import device_augment

    def run(epoch):
        loader = make_loader(textured, CFG, batch_size=2, num_batches=2, epoch=epoch, augment_on_device=True)
        return [(b, device_augment(b, "cpu", CFG.size)) for b in loader]

    a, b, c = run(0), run(0), run(1)
    for (x, vx), (y, vy) in zip(a, b):
        assert x["video_id"] == y["video_id"] and torch.equal(vx, vy)
        assert torch.equal(device_augment(x, "cpu", CFG.size, chunk=3), vx)  # chunking changes nothing
        assert all(torch.equal(x[k], y[k]) for k in x if isinstance(x[k], torch.Tensor))
    assert [x["video_id"] for x, _ in a] != [x["video_id"] for x, _ in c]


def test_augment_on_device_in_worker_processes(data):
    """Two DataLoader workers: frames decoded into shared memory arrive intact (plain views read back
    the planned frames from the coded pixels)."""
    from moquad.data.augment import MEAN, device_augment
    from moquad.data.testing import decode_code

    cfg = dataclasses.replace(CFG, workers=2, crop_scale=(1.0, 1.0), flip=False, color_jitter=0.0, grayscale=0.0,
                              augment_on_device=True)
    batches = list(make_loader(data, cfg, batch_size=2, num_batches=3, debug=True))
    assert len(batches) == 3 and len({v for b in batches for v in b["video_id"]}) == 6
    for batch in batches:
        assert batch["raw"].is_shared()
        out = _levels(device_augment(batch, "cpu", cfg.size)) + torch.tensor(MEAN).view(3, 1, 1, 1) * 255
        for b, info in enumerate(batch["info"]):
            video = int(batch["video_id"][b][1:])
            for v, name in enumerate(batch["view_names"]):
                if not name.startswith("ad_"):
                    codes = [decode_code(out[b, v, :, t].mean(dim=(1, 2)).numpy()) for t in range(cfg.frames)]
                    assert codes == [(video, int(i)) for i in info["indices"][v]]


def test_tar_members_match_tarfile(tmp_path):
    import io
    import tarfile

    from moquad.data.tarread import tar_members

    names = ["a.json", "dir/" + "x" * 120 + ".jpgs", "é ü.json", "c.jpgs"]  # PAX/GNU long and non-ASCII names
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT):
        path = tmp_path / f"t{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tar:
            for i, name in enumerate(names):
                if fmt == tarfile.USTAR_FORMAT and len(name) > 100:
                    name = "sub/" + "y" * 60 + "/" + "z" * 80 + ".jpgs"  # ustar prefix field
                info = tarfile.TarInfo(name)
                info.size = 300 * i
                tar.addfile(info, io.BytesIO(bytes(range(256)) * 5))
            info = tarfile.TarInfo("folder")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        with tarfile.open(path) as tar:
            ref = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
        with open(path, "rb") as f:
            assert list(tar_members(f)) == ref
        damaged = bytearray(path.read_bytes())
        damaged[600] ^= 0xFF  # inside the second header
        (tmp_path / "bad.tar").write_bytes(bytes(damaged))
        with open(tmp_path / "bad.tar", "rb") as f, pytest.raises(ValueError, match="verify"):
            list(tar_members(f))
