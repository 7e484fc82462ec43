"""End to end: dataset layout of real + broken clips -> shards + manifests, checked independently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from test_preprocess_layouts import make_hmdb51, make_k400, make_ssv2, make_ucf101, pyav_count
from video_fixtures import shard_paths

from moquad.config import PreprocessConfig
from moquad.data.store import SCHEMA_VERSION, Split, decode_frames, read_errors, read_info, read_manifest
from moquad.preprocess.manifest import verify
from moquad.preprocess.run import merge, preprocess


def _cfg(root, out, **kw) -> PreprocessConfig:
    base = dict(dataset="ucf101", root=str(root), out=str(out), short_side=32, workers=1, shard_size=2_000_000)
    return PreprocessConfig(**{**base, **kw})


def _videos(out) -> dict[str, dict]:
    info = read_info(out)
    rows = {}
    for split in info["splits"]:
        for r in read_manifest(out, split).to_pylist():
            assert r["video_id"] not in rows
            rows[r["video_id"]] = r
    return rows


@pytest.fixture(scope="module")
def ucf(real_videos_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ucf_raw")
    expect = make_ucf101(root, real_videos_dir)
    out = tmp_path_factory.mktemp("ucf_out") / "shards"
    summary = preprocess(_cfg(root, out, workers=2), quiet=True)
    return root, out, expect, summary


def test_counts_labels_splits_frames_match_direct_decode(ucf):
    root, out, expect, summary = ucf
    rows = _videos(out)
    good = {k: e for k, e in expect.items() if e["broken"] is None}
    assert set(rows) == set(good)
    for vid, e in good.items():
        r = rows[vid]
        assert (r["split"], r["label"], r["class_name"]) == (e["split"], e["label"], e["class_name"])
        assert r["num_frames"] == pyav_count(str(e["path"]))
        assert min(r["width"], r["height"]) == 32 and r["width"] % 2 == 0 and r["height"] % 2 == 0
    info = read_info(out)
    assert info["classes"] == ["CartWheel", "Wave"] and info["schema_version"] == SCHEMA_VERSION
    assert info["splits"] == {"train": 6, "test": 2} or info["splits"] == {"test": 2, "train": 6}
    assert info["preprocess"]["short_side"] == 32
    assert summary["ok"] == 8 and summary["failed"] == 6 and summary["missing"] == 1
    assert summary["frames"] == sum(r["num_frames"] for r in rows.values())


def test_errors_parquet_has_a_reason_per_bad_input(ucf):
    _, out, expect, _ = ucf
    errors = {r["video_id"]: r for r in read_errors(out).to_pylist()}
    bad = {k: e for k, e in expect.items() if e["broken"] is not None}
    assert set(errors) == set(bad)
    for vid, e in bad.items():
        assert errors[vid]["reason"].startswith(e["broken"]), (vid, errors[vid]["reason"])
        assert errors[vid]["split"] == e["split"]


def test_every_frame_decodes_from_its_byte_range_alone(ucf):
    _, out, expect, _ = ucf
    for split in ("train", "test"):
        table = read_manifest(out, split)
        reader = Split(out, split)
        for n, r in enumerate(table.to_pylist()):
            fo = r["frame_offsets"]
            with open(out / r["shard"], "rb") as f:
                for i in range(r["num_frames"]):
                    f.seek(r["jpgs_offset"] + fo[i])
                    one = f.read(fo[i + 1] - fo[i])
                    img = decode_frames(one, [0, len(one)], [0])[0]
                    assert img.shape == (r["height"], r["width"], 3)
            frames = reader.read_frames(n, [0, r["num_frames"] - 1])
            assert frames.shape == (2, r["height"], r["width"], 3)


def test_webdataset_and_tar_read_the_shards(ucf):
    _, out, _, _ = ucf
    urls = [str(p) for p in shard_paths(out, "train")]
    assert len(urls) >= 2  # small shard size: several shards, none holding a single class only by accident
    seen = {}
    for sample in wds.WebDataset(urls, shardshuffle=False):
        meta = json.loads(sample["json"])
        seen[meta["video_id"]] = meta
        fo = meta["frame_offsets"]
        assert len(sample["jpgs"]) == fo[-1] == meta["jpgs_size"]
        last = decode_frames(sample["jpgs"], fo, [meta["num_frames"] - 1])
        assert last.shape[1:3] == (meta["height"], meta["width"])
        assert "shard" not in meta and "offset" not in meta
    manifest = {r["video_id"]: r for r in read_manifest(out, "train").to_pylist()}
    assert set(seen) == set(manifest)
    classes_per_shard = {}
    for r in manifest.values():
        classes_per_shard.setdefault(r["shard"], set()).add(r["label"])
    assert max(len(c) for c in classes_per_shard.values()) == 2  # seeded shuffle mixes classes
    with tarfile.open(urls[0]) as tar:
        names = tar.getnames()
    assert all(n.endswith((".json", ".jpgs")) and n.count(".") == 1 for n in names)


def test_verify_is_clean_and_rerun_is_a_no_op(ucf):
    root, out, _, _ = ucf
    assert verify(out) == []
    before = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    summary = preprocess(_cfg(root, out, workers=2), quiet=True)
    assert summary["ok"] == 8 and summary["failed"] == 6
    assert {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == before
    with pytest.raises(ValueError, match="different settings"):
        preprocess(_cfg(root, out, short_side=48), quiet=True)


def test_multipart_union_equals_single_run(ucf, tmp_path):
    root, single, _, _ = ucf
    out = tmp_path / "parts"
    s0 = preprocess(_cfg(root, out, num_parts=2, part=0), quiet=True)
    assert "merged" not in s0 and not (out / "dataset.json").exists()
    with pytest.raises(ValueError, match="parts 1 of 2"):
        merge(out, quiet=True)
    s1 = preprocess(_cfg(root, out, num_parts=2, part=1), quiet=True)
    assert s1["merged"]["ok"] == 8
    parts = {p.name.split("-")[1] for p in (out / "shards").glob("*.tar")}
    assert parts == {"000", "001"}
    a, b = _videos(out), _videos(single)
    assert set(a) == set(b)
    assert all(a[k]["checksum"] == b[k]["checksum"] for k in a)  # same bytes whichever node made them
    assert verify(out) == []
    assert merge(out, quiet=True)["ok"] == 8  # merging again is harmless
    assert sorted(read_errors(out).column("video_id").to_pylist()) == sorted(read_errors(single).column("video_id").to_pylist())


def test_limit_shuffle_and_bad_arguments(ucf, tmp_path, real_videos_dir):
    root, _, _, _ = ucf
    s = preprocess(_cfg(root, tmp_path / "lim", limit=2, dataset="ucf101"), quiet=True)
    assert s["ok"] + s["failed"] + s["missing"] == 4  # 2 per split
    with pytest.raises(FileNotFoundError, match="does not exist"):
        preprocess(_cfg(tmp_path / "nope", tmp_path / "o"), quiet=True)
    with pytest.raises(ValueError, match="unknown dataset|dataset must be one of"):
        preprocess(_cfg(root, tmp_path / "o", dataset="kinetics"), quiet=True)
    with pytest.raises(ValueError, match="--part|part must be below num_parts"):
        preprocess(_cfg(root, tmp_path / "o", num_parts=2, part=2), quiet=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no videos found"):
        preprocess(_cfg(tmp_path / "empty", tmp_path / "o", dataset="folder"), quiet=True)


def test_k400_missing_videos_are_counted_not_fatal(real_videos_dir, tmp_path):
    make_k400(tmp_path / "k", real_videos_dir)
    s = preprocess(_cfg(tmp_path / "k", tmp_path / "o", dataset="k400"), quiet=True)
    assert (s["ok"], s["missing"], s["failed"]) == (3, 1, 0)
    assert read_info(tmp_path / "o")["splits"] == {"train": 2, "val": 1}
    assert read_errors(tmp_path / "o").column("reason").to_pylist()[0].startswith("missing")


@pytest.mark.parametrize("dataset,make", [("hmdb51", make_hmdb51), ("ssv2", make_ssv2)])
def test_other_layouts_end_to_end(real_videos_dir, tmp_path, dataset, make):
    expect = make(tmp_path / "raw", real_videos_dir)
    preprocess(_cfg(tmp_path / "raw", tmp_path / "o", dataset=dataset), quiet=True)
    rows = _videos(tmp_path / "o")
    assert {k: (r["split"], r["label"]) for k, r in rows.items()} == {k: (e["split"], e["label"]) for k, e in expect.items()}
    for r in rows.values():
        assert r["num_frames"] == pyav_count(r["source_path"])
    assert verify(tmp_path / "o") == []


_CHILD = """
import sys
from moquad.config import PreprocessConfig
from moquad.preprocess.run import preprocess
preprocess(PreprocessConfig(dataset="ucf101", root=sys.argv[1], out=sys.argv[2], short_side=32, workers=1,
                            shard_size=150_000), quiet=True)
"""


def _run_and_kill(root: Path, out: Path, wait_for, timeout: float = 30.0) -> bool:
    """Start a preprocess child; SIGKILL it as soon as ``wait_for(out)`` holds. True if it was killed."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), str(out)], env={**os.environ})
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            if wait_for(out):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return False


def test_kill_9_at_any_moment_then_resume_gives_the_same_videos(ucf, tmp_path):
    root, single, _, _ = ucf
    out = tmp_path / "crash"
    parts = out / "manifests" / "_parts"
    shards = out / "shards"
    moments = [
        lambda o: any(shards.glob("*.tmp")),  # mid-shard
        lambda o: len(list(parts.glob("train-*.parquet"))) >= 1,  # just after a commit
        lambda o: any(shards.glob("*.tar")) and len(list(shards.glob("*.tar"))) > len(list(parts.glob("t*-*.parquet"))),
    ]
    killed = 0
    for when in moments:
        killed += _run_and_kill(root, out, when)
        for tar_path in shards.glob("*.tar"):  # whatever is under a final name is a complete tar
            assert tar_path.stat().st_size % tarfile.RECORDSIZE == 0
            with tarfile.open(tar_path) as tar:
                names = [m.name for m in tar]
            assert names and len(names) % 2 == 0
    assert killed >= 1
    subprocess.run([sys.executable, "-c", _CHILD, str(root), str(out)], check=True)
    assert verify(out) == []
    a, b = _videos(out), _videos(single)
    assert set(a) == set(b)
    assert all(a[k]["checksum"] == b[k]["checksum"] and a[k]["num_frames"] == b[k]["num_frames"] for k in a)
    errors = read_errors(out).column("video_id").to_pylist()
    assert len(errors) == len(set(errors)) == 7
    assert not list(shards.glob("*.tmp"))
    # every shard on disk is referenced, none twice
    referenced = {r["shard"] for r in a.values()}
    assert {f"shards/{p.name}" for p in shards.glob("*.tar")} == referenced
    assert np.all([r["num_frames"] > 0 for r in a.values()])


_CRASH_ID = "v_Wave_g03_c01"


def _crashy_work(video, *args):
    """Stands in for a decoder that segfaults on one file: the worker process dies."""
    if video.video_id == _CRASH_ID:
        os._exit(139)
    return _real_work(video, *args)


def test_a_worker_crash_is_one_error_row_not_a_dead_run(ucf, tmp_path, monkeypatch):
    import moquad.preprocess.engines as run

    root, single, _, _ = ucf
    global _real_work
    _real_work = run.transcode_one
    monkeypatch.setattr(run, "transcode_one", _crashy_work)
    s = preprocess(_cfg(root, tmp_path / "o", workers=2), quiet=True)
    assert s["ok"] == 7 and s["failed"] == 7
    errors = {r["video_id"]: r["reason"] for r in read_errors(tmp_path / "o").to_pylist()}
    assert errors[_CRASH_ID].startswith("crashed the decoder")
    assert set(_videos(tmp_path / "o")) == set(_videos(single)) - {_CRASH_ID}
