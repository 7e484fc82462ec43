"""The manifest-indexed loader: batch contract, exact epochs (sampler and a real 2-rank gloo group with
workers), determinism, O(1) resume, reads by offset, bad samples, missing/stray shards."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from s3server import free_port
from video_fixtures import coded_dataset, decode_code, write_dataset

from moquad.config import LoaderConfig
from moquad.data import store
from moquad.data.augment import STD, apply_views, normalize, to_model
from moquad.data.epoch_plan import EpochPlan
from moquad.data.pipeline import make_loader
from moquad.data.views import fixed_pair, quadruple, speed_pair
from moquad.errors import MoquadError

CFG = LoaderConfig(frames=4, size=16, dilations=(1, 2), workers=0)
PLANS = {"quadruple": quadruple, "speed_pair": speed_pair, "fixed_pair": fixed_pair}  # the shipped view plans


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return coded_dataset(tmp_path_factory.mktemp("pipe"), num_videos=14, num_frames=24, videos_per_shard=2)


def _ids(loader) -> list[str]:
    return [vid for batch in loader for vid in batch["video_id"]]


# ---------------------------------------------------------------- exact epochs: the sampler


@pytest.mark.parametrize("n, per_rank, world", [(14, 2, 2), (100, 3, 8), (64, 8, 8), (7, 7, 1), (50, 1, 3)])
def test_epoch_plan_guarantees(n, per_rank, world):
    g = per_rank * world
    union: set[int] = set()
    for epoch in range(12):
        plan = EpochPlan(n, per_rank, world, seed=3, epoch=epoch)
        assert plan.num_batches == n // g
        used: list[int] = []
        for j in range(plan.num_batches):
            parts = [plan.batch(j, r).tolist() for r in range(world)]
            assert all(len(p) == per_rank for p in parts)  # equal on every rank
            flat = [v for p in parts for v in p]
            assert len(set(flat)) == g  # no video twice in a global batch
            used += flat
            spares = [list(plan.spares(j, r)) for r in range(world)]
            assert not any(set(s) & set(flat) for s in spares)  # spares lie outside the global batch
            assert all(not set(spares[a]) & set(spares[b]) for a in range(world) for b in range(a))  # rank-disjoint
        assert len(used) == len(set(used)) == (n // g) * g  # each video at most once, exact count
        union |= set(used)
    assert union == set(range(n))  # the dropped remainder rotates: every video is used


def test_batch_larger_than_the_split_is_one_clear_error():
    with pytest.raises(MoquadError, match=r"global batch of 16 videos .* larger than the split \(14 videos\)"):
        EpochPlan(14, 8, 2, 0, 0)


# ---------------------------------------------------------------- the loader


@pytest.mark.parametrize(
    "changes, names",
    [
        ({}, ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")),
        ({"intra_neg": False, "ad_intra_neg": False}, ("anchor", "ad_pos")),
        ({"ad_pos": False, "intra_neg": False, "ad_intra_neg": False}, ("anchor", "pos")),
        ({"ad_pos": False}, ("anchor", "pos", "intra_neg", "ad_intra_neg")),
        ({"mode": "fixed_pair"}, ("clip1", "clip2")),
        ({"mode": "speed_pair"}, ("clip_n", "clip_m")),
    ],
)
def test_batch_contract(data, changes, names):
    changes = dict(changes)
    mode = changes.pop("mode", "quadruple")
    cfg = dataclasses.replace(CFG, **changes)
    loader = make_loader(data, cfg, batch_size=3, views=PLANS[mode](cfg))
    batches = list(loader)
    assert len(loader) == len(batches) == 14 // 3
    b, v = batches[0], len(names)
    assert b["view_names"] == names and b["bad"] == [] and b["roles"] == PLANS[mode](cfg).roles
    assert b["views"].dtype == torch.uint8 and b["views"].shape == (3, v, 3, 4, 16, 16)
    assert b["index"].dtype == torch.int64 and [f"v{i:02d}" for i in b["index"].tolist()] == b["video_id"]
    assert b["label"].dtype == torch.int64 and b["label"].tolist() == [int(i[1:]) % 4 for i in b["video_id"]]
    assert b["lam"].dtype == torch.float32 and b["lam"].shape == (3, v)
    assert torch.all((b["lam"] > 0) == torch.tensor([n.startswith("ad_") for n in names]))
    for info in b["info"]:
        n, m = info["dilations"]
        steps = [set(np.diff(np.asarray(i)).tolist()) for i in info["indices"]]
        if mode == "fixed_pair":
            assert steps == [{cfg.simclr_dilation}] * 2
        elif mode == "speed_pair":
            assert steps == [{n}, {m}] and n != m
        elif cfg.intra_neg:
            assert steps[:3] == [{n}, {n}, {m}] and n != m


def test_deterministic_whatever_the_workers_new_epoch_new_order(data):
    a = list(make_loader(data, CFG, batch_size=2))
    b = list(make_loader(data, dataclasses.replace(CFG, workers=2), batch_size=2))
    assert [x["video_id"] for x in a] == [x["video_id"] for x in b]
    assert all(torch.equal(x["views"], y["views"]) and torch.equal(x["lam"], y["lam"]) for x, y in zip(a, b))
    assert _ids(make_loader(data, CFG, batch_size=2, epoch=1)) != _ids(a)
    assert _ids(make_loader(data, dataclasses.replace(CFG, seed=1), batch_size=2)) != _ids(a)


def test_run_loader_keeps_its_workers_and_gives_the_same_batches(data):
    """The trainer's RunLoader (built once, 2 workers kept across epochs; each epoch only sets the sampler) gives
    batch for batch what a fresh one-epoch loader gives, through epochs, modes, a resume start and a cap."""
    from moquad.data.pipeline import RunLoader

    cfg = dataclasses.replace(CFG, workers=2)
    run = RunLoader(data, cfg, batch_size=2)
    pids = None
    for epoch, mode, start, cap in [(0, "speed_pair", 0, None), (1, "quadruple", 3, None), (2, "quadruple", 1, 4)]:
        plan = PLANS[mode](cfg)
        got = list(make_loader(run, cfg, batch_size=2, epoch=epoch, views=plan, start=start, num_batches=cap))
        ref = list(make_loader(data, CFG, batch_size=2, epoch=epoch, views=plan, start=start, num_batches=cap))
        assert [x["video_id"] for x in got] == [x["video_id"] for x in ref] and len(got) == (cap or 7) - start
        assert all(torch.equal(x["views"], y["views"]) and torch.equal(x["lam"], y["lam"]) for x, y in zip(got, ref))
        workers = [w.pid for w in run.loader._iterator._workers]
        assert pids is None or workers == pids  # the same processes every epoch
        pids = workers
    with pytest.raises(ValueError, match="RunLoader was built with"):
        make_loader(run, cfg, batch_size=4)


def test_a_process_with_a_live_run_loader_exits(data, tmp_path):
    """Kept workers ignore SIGTERM (moquad.data.workers), which multiprocessing's exit handler sends before it joins
    them: a RunLoader still alive at exit must stop its workers first, or the process hangs (measured: it did)."""
    import subprocess
    import sys

    script = tmp_path / "live.py"
    script.write_text(
        "from moquad.config import LoaderConfig\nfrom moquad.data.pipeline import RunLoader, make_loader\n"
        "cfg = LoaderConfig(frames=4, size=16, dilations=(1, 2), workers=2)\n"
        f"run = RunLoader({str(data)!r}, cfg, batch_size=2)\n"
        "next(iter(make_loader(run, cfg, batch_size=2)))\nprint('ok')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_resume_computes_the_batch_at_step_k(data, monkeypatch):
    """Starting at batch k gives batches k.. of the full epoch, and reads only those batches' videos."""
    full = list(make_loader(data, CFG, batch_size=2))
    reads = Counter()
    payload = store.Split.payload

    def counted(self, i, verify=True):
        reads[int(i)] += 1
        return payload(self, i, verify)

    monkeypatch.setattr(store.Split, "payload", counted)
    tail = list(make_loader(data, CFG, batch_size=2, start=5))
    assert [x["video_id"] for x in tail] == [x["video_id"] for x in full[5:]]
    assert all(torch.equal(x["views"], y["views"]) for x, y in zip(tail, full[5:]))
    assert sum(reads.values()) == 2 * len(tail)  # nothing before step k is read or decoded


def test_reads_by_offset_only_the_manifest_shards_and_bytes_of_used_videos(data, tmp_path, monkeypatch):
    cfg = dataclasses.replace(CFG, appearance_op="none")  # no donor frames: bytes = the used payloads
    stray = tmp_path / "data"
    import shutil

    shutil.copytree(data, stray)
    coded_dataset(tmp_path / "other", num_videos=2, num_frames=8)
    shutil.copy(tmp_path / "other" / "shards" / "train-000-000000.tar", stray / "shards" / "train-999-000000.tar")
    opened = []
    def counted(p, o, s, read=store.read_bytes):
        opened.append(str(p))
        return read(p, o, s)

    monkeypatch.setattr(store, "read_bytes", counted)
    batches = list(make_loader(stray, cfg, batch_size=4))
    split = store.Split(stray)
    used = np.concatenate([b["index"].numpy() for b in batches])
    assert sum(b["bytes"] for b in batches) == int(split.size[used].sum())
    assert len(opened) == len(used)  # ONE read per sample
    assert not any("train-999" in p for p in opened)  # a stray tar the manifest does not name is never read


def test_missing_or_short_shard_is_an_error_at_start_up(data, tmp_path):
    import shutil

    broken = tmp_path / "d"
    shutil.copytree(data, broken)
    (broken / "shards" / "train-000-000003.tar").unlink()
    with pytest.raises(MoquadError, match=r"train-000-000003.tar named by manifests/train.parquet is missing.*verify"):
        make_loader(broken, CFG, batch_size=2)
    shutil.copytree(data, tmp_path / "e")
    shard = tmp_path / "e" / "shards" / "train-000-000001.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(MoquadError, match="shorter"):
        make_loader(tmp_path / "e", CFG, batch_size=2)


def _damage(root, video: str) -> None:
    """Flip a byte inside every JPEG header of ``video``'s payload: checksum and decoding both fail."""
    split = store.Split(root)
    i = list(split.video_id).index(video)
    path = split.shard_path(i)
    blob = bytearray(path.read_bytes())
    for f in split.frame_offsets(i)[:-1]:
        blob[int(split.offset[i] + f) + 3] ^= 0xFF
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("verify", [True, False])
def test_bad_sample_is_replaced_by_a_spare_and_reported(data, tmp_path, verify):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(data, root)
    _damage(root, "v05")
    cfg = dataclasses.replace(CFG, verify_checksums=verify)
    batches = list(make_loader(root, cfg, batch_size=2))  # 7 batches: every video is drawn
    bad = [b for batch in batches for b in batch["bad"]]
    assert [b["video_id"] for b in bad] == ["v05"]
    assert bad[0]["reason"] == ("checksum mismatch" if verify else bad[0]["reason"])
    assert verify or bad[0]["reason"].startswith("JPEG decode failed")
    assert bad[0]["shard"].startswith("shards/train-")
    assert all(len(b["video_id"]) == 2 and len(set(b["video_id"])) == 2 for b in batches)  # full, no duplicate
    assert "v05" not in _ids(batches)


def test_two_ranks_with_workers_over_three_epochs(data):
    """Real gloo group, 2 DataLoader workers per rank: the exact-epoch guarantees hold end to end."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_main, args=(free_port(), str(data), out), nprocs=2, join=True)
        epochs = out["epochs"]
    union = set()
    for r0, r1 in epochs:
        assert r0["refused"] and r1["refused"]
        assert len(r0["batches"]) == len(r1["batches"]) == 14 // 4  # equal counts
        for a, b in zip(r0["batches"], r1["batches"]):
            assert len(set(a) | set(b)) == 4  # no duplicate in a global batch
        used = [v for r in (r0, r1) for batch in r["batches"] for v in batch]
        assert len(used) == len(set(used)) == 12  # exact coverage of the epoch
        union |= set(used)
    assert union == {f"v{i:02d}" for i in range(14)}  # union over 3 epochs: every video


def _rank_main(rank: int, port: int, data: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = dataclasses.replace(CFG, workers=2)
        epochs = []
        for epoch in range(3):
            try:  # a loader that ignores the group would duplicate data: refused
                make_loader(data, cfg, batch_size=2, epoch=epoch)
                refused = False
            except ValueError:
                refused = True
            loader = make_loader(data, cfg, batch_size=2, rank=rank, world_size=2, epoch=epoch)
            epochs.append({"batches": [b["video_id"] for b in loader], "refused": refused})
        gathered: list = [None, None]
        dist.all_gather_object(gathered, epochs)
        if rank == 0:
            out["epochs"] = list(zip(*gathered))
    finally:
        dist.destroy_process_group()


def test_errors(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest"):
        make_loader(tmp_path, CFG, batch_size=2)
    with pytest.raises(ValueError, match="ViewPlan"):
        make_loader(data, CFG, batch_size=2, views="byol")
    with pytest.raises(ValueError, match="appearance_op"):
        make_loader(data, dataclasses.replace(CFG, appearance_op="mixup"), batch_size=2)
    with pytest.raises(ValueError, match="rank"):
        make_loader(data, CFG, batch_size=2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="two different"):
        make_loader(data, dataclasses.replace(CFG, dilations=(2,)), batch_size=2)


# ---------------------------------------------------------------- pixels: short videos, real shards, two paths


def test_short_videos_never_wrap_and_reverse_their_intra_negatives(tmp_path):
    """Coded frames read back from the pixels: 10-frame videos fit only dilation 1 of {1, 2, 4} for 6-frame
    clips (spans 6, 11, 21): every clip is a straight run, Intra-Negs are the reversed clip at n."""
    from video_fixtures import coded_video

    root = write_dataset(tmp_path / "short", [(f"v{i:02d}", coded_video(i, 10), 0) for i in range(4)])
    cfg = dataclasses.replace(CFG, frames=6, dilations=(1, 2, 4), crop_scale=(1.0, 1.0), flip="none",
                              color_jitter=0.0, grayscale=0.0, size=32)
    for b in make_loader(root, cfg, batch_size=2):
        for i, info in enumerate(b["info"]):
            assert info["rule"] == "reverse" and info["dilations"] == (1, 1)
            video = int(b["video_id"][i][1:])
            for v, name in enumerate(b["view_names"]):
                clip = b["views"][i, v].float()
                codes = [decode_code(clip[:, t].mean(dim=(1, 2)).numpy()) for t in range(6)]
                frames = [f for vid, f in codes]
                if name.startswith("ad_"):
                    continue
                assert all(vid == video for vid, _ in codes)
                step = np.diff(frames)
                assert set(step.tolist()) == ({-1} if name == "intra_neg" else {1})


@pytest.fixture(scope="module")
def preprocessed(synth_root, tmp_path_factory):
    """Synthetic UCF101-layout videos through the real preprocess (several shards per split)."""
    from moquad.config import PreprocessConfig
    from moquad.preprocess.run import preprocess

    out = tmp_path_factory.mktemp("prep")
    preprocess(PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(out), short_side=32, workers=1,
                                shard_size=30_000), quiet=True)  # source bytes: several shards
    return out


def test_real_shards_give_the_manifest_frames_and_cross_shard_donors(preprocessed):
    split = store.Split(preprocessed)
    row = {str(v): i for i, v in enumerate(split.video_id)}
    cfg = dataclasses.replace(CFG, frames=6, size=32, crop_scale=(1.0, 1.0), flip="none", color_jitter=0.0,
                              grayscale=0.0, workers=2, dilations=(1, 3))
    assert len(split.shards) > 2
    for b in make_loader(preprocessed, cfg, batch_size=2):
        for i, vid in enumerate(b["video_id"]):
            r = row[vid]
            assert b["label"][i] == split.label[r]
            for v in (0, 2):  # anchor, intra_neg: plain clips = the frames read straight from the shard
                ref = split.read_frames(r, b["info"][i]["indices"][v])
                got = b["views"][i, v].permute(1, 2, 3, 0).numpy()
                assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1
            donors = [d for ids in b["info"][i]["donor_ids"] for d in ids]
            assert donors and vid not in donors  # never the sample's own video
            # other shards first: a mosaic uses its own shard's videos only once every other-shard video is in
            # it (a split this small, <= k*k + 1 videos, is the whole donor pool: distinct donors)
            assert len(split) <= cfg.rad_k ** 2 + 1
            elsewhere = {str(v) for v, s in zip(split.video_id, split.shard) if s != split.shard[r]}
            for ids in b["info"][i]["donor_ids"]:
                if any(split.shard[row[d]] == split.shard[r] for d in ids):
                    assert elsewhere <= set(ids)


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """Smooth textured videos of two frame sizes (batches need padding)."""
    def video(frames, h, w, seed):
        yy, xx = np.mgrid[0:h, 0:w]
        x = [np.stack([127 + 100 * np.sin(xx / (4 + c) + yy / (6 + 2 * c) + 0.4 * t + seed) for c in range(3)], -1)
             for t in range(frames)]
        return np.stack(x).astype(np.uint8)

    videos = [(f"v{i:02d}", video(24, *((40, 56) if i % 2 else (48, 44)), i), i % 4) for i in range(6)]
    return write_dataset(tmp_path_factory.mktemp("tex"), videos, videos_per_shard=2)


@pytest.mark.parametrize("changes", [{}, {"appearance_op": "be"}, {"appearance_op": "rad_intra"}, {"mode": "fixed_pair"}])
def test_worker_and_device_paths_give_the_same_views(textured, changes):
    """One ViewParams, one apply_views: the worker path (uint8 out) and the device path (float) differ only
    by the final rounding (<= 0.5 levels of 255) plus float noise."""
    changes = dict(changes)
    mode = changes.pop("mode", "quadruple")
    cfg = dataclasses.replace(CFG, size=32, color_jitter=0.8, grayscale=0.2, **changes)
    cpu = next(iter(make_loader(textured, cfg, batch_size=3, views=PLANS[mode](cfg))))
    raw = next(iter(make_loader(textured, dataclasses.replace(cfg, augment_on_device=True), batch_size=3,
                                views=PLANS[mode](cfg))))
    assert "views" not in raw and raw["raw"].shape[2:] == (48, 56, 3)  # padded to the largest frame
    assert raw["video_id"] == cpu["video_id"] and torch.equal(raw["lam"], cpu["lam"])
    out = to_model(raw, "cpu", cfg.size)
    levels = (out - normalize(cpu["views"], "cpu")).abs() * torch.tensor(STD).view(3, 1, 1, 1) * 255
    assert out.shape == (3, len(cpu["view_names"]), 3, 4, 32, 32)
    assert float(levels.max()) <= 0.51
    # decode_on_device: workers ship JPEG bytes; torchvision decodes them (nvJPEG on CUDA; libjpeg-turbo here)
    jpeg = next(iter(make_loader(textured, dataclasses.replace(cfg, decode_on_device=True), batch_size=3,
                                 views=PLANS[mode](cfg))))
    assert "raw" not in jpeg and jpeg["jpeg"].dtype == torch.uint8 and int(jpeg["jpeg_count"].sum()) == \
        len(jpeg["jpeg_offsets"]) - 1
    assert torch.equal(to_model(jpeg, "cpu", cfg.size), out)


def test_augment_on_device_in_worker_processes(data):
    """Two DataLoader workers: frames decoded into shared memory arrive intact (plain views read back
    the planned frames from the coded pixels)."""
    cfg = dataclasses.replace(CFG, workers=2, crop_scale=(1.0, 1.0), flip="none", color_jitter=0.0, grayscale=0.0,
                              augment_on_device=True)
    batches = list(make_loader(data, cfg, batch_size=2))
    assert len(batches) == 7 and len(_ids(batches)) == 14
    for batch in batches:
        assert batch["raw"].is_shared()
        out = apply_views(batch, cfg.size)  # (B, V, T, S, S, 3) float 0..255
        for b, info in enumerate(batch["info"]):
            video = int(batch["video_id"][b][1:])
            for v, name in enumerate(batch["view_names"]):
                if not name.startswith("ad_"):
                    codes = [decode_code(out[b, v, t].mean(dim=(0, 1)).numpy()) for t in range(cfg.frames)]
                    assert codes == [(video, int(i)) for i in info["indices"][v]]



@pytest.mark.parametrize("device_side", [False, True])
def test_recycled_worker_buffers_give_the_same_batches(data, device_side):
    """``recycle`` (on with pin_memory): each worker reuses its shared batch buffers every PREFETCH + 1 batches. A
    consumer that copies every batch out (as pin_memory does) gets, through three epochs of a run loader with 1 and
    2 workers, exactly what fresh buffers give; and a worker really reuses them (its storages are the same ones)."""
    from moquad.data.augment import to_model
    from moquad.data.pipeline import PREFETCH, RunLoader

    def copied(batch: dict) -> torch.Tensor:
        return batch["raw"].clone() if device_side else batch["views"].clone()

    base = dataclasses.replace(CFG, augment_on_device=device_side)
    for workers in (1, 2):
        cfg = dataclasses.replace(base, workers=workers)
        run = RunLoader(data, cfg, batch_size=2, recycle=True)
        for epoch in range(3):
            got = [(copied(b), b) for b in make_loader(run, cfg, batch_size=2, epoch=epoch, recycle=True)]
            ref = list(make_loader(data, base, batch_size=2, epoch=epoch))
            assert [b["video_id"] for _, b in got] == [b["video_id"] for b in ref]
            for (pixels, b), r in zip(got, ref):
                if device_side:  # compare what is read: the views made from the frames (padding is never read)
                    b = {**b, "raw": pixels}
                    assert torch.equal(to_model(b, "cpu", cfg.size), to_model(r, "cpu", cfg.size))
                else:
                    assert torch.equal(pixels, r["views"])
            if not device_side:  # kept (not copied) batches were overwritten: the buffers were reused
                assert any(not torch.equal(pixels, b["views"]) for pixels, b in got)
        run.close()
    # the reuse itself, in this process: the same storage every PREFETCH + 1 batches, a bigger one when needed
    from moquad.data.pipeline import BufferRing

    ring, seen = BufferRing(), []
    for _ in range(2 * (PREFETCH + 1)):
        ring.next_batch()
        seen.append(ring.storage("views", 1000).data_ptr())
    assert seen[: PREFETCH + 1] == seen[PREFETCH + 1 :] and len(set(seen)) == PREFETCH + 1
    ring.next_batch()
    assert ring.storage("views", 5000).nbytes() >= 5000


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
def test_pin_memory_without_an_accelerator_gives_the_batches(data):
    """The DataLoader pins only with an accelerator; without one nothing copies the batches out, so the workers
    must not reuse their buffers: ``list(loader)`` with ``pin_memory=True`` (2 workers, each with more than
    PREFETCH + 1 batches) equals the ``workers=0`` reference bit for bit, from make_loader and from a RunLoader."""
    from moquad.data.pipeline import RunLoader

    if torch.accelerator.is_available():
        pytest.skip("pinning is really on with an accelerator")
    cfg = dataclasses.replace(CFG, workers=2)
    ref = list(make_loader(data, CFG, batch_size=2, epoch=1))
    run = RunLoader(data, cfg, batch_size=2, pin_memory=True)
    for loader in (make_loader(data, cfg, batch_size=2, epoch=1, pin_memory=True),
                   make_loader(run, cfg, batch_size=2, epoch=1, pin_memory=True)):
        got = list(loader)
        assert len(got) == len(ref) == 7
        assert all(torch.equal(g["views"], r["views"]) for g, r in zip(got, ref))
    run.close()


def test_a_live_run_loader_iterator_keeps_its_epoch(data):
    """An iterator from make_loader(run, epoch=0) gives epoch 0's batches even after make_loader(run, epoch=1)."""
    from moquad.data.pipeline import RunLoader

    for workers in (0, 2):
        cfg = dataclasses.replace(CFG, workers=workers)
        ref = [_ids([b]) for b in make_loader(data, CFG, batch_size=2, epoch=0)]
        assert ref != [_ids([b]) for b in make_loader(data, CFG, batch_size=2, epoch=1)]
        run = RunLoader(data, cfg, batch_size=2)
        it = iter(make_loader(run, cfg, batch_size=2, epoch=0))
        first = _ids([next(it)])
        make_loader(run, cfg, batch_size=2, epoch=1)
        assert [first] + [_ids([b]) for b in it] == ref
        run.close()
