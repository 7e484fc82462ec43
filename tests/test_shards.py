"""Shard writer: tar layout and offsets, roll-over, atomic commit, safe keys."""

from __future__ import annotations

import hashlib
import json
import tarfile

import pyarrow.parquet as pq
import webdataset as wds

from moquad.preprocess.manifest import sample_key
from moquad.preprocess.shards import ShardWriter


def _row(vid: str, payload: bytes) -> dict:
    return {"video_id": vid, "split": "train", "label": 0, "class_name": "c", "source_path": f"/x/{vid}.mp4",
            "jpgs_size": len(payload), "num_frames": 1, "fps": 25.0, "width": 2, "height": 2,
            "frame_offsets": [0, len(payload)], "checksum": hashlib.sha256(payload).hexdigest()}


def test_sample_keys_are_safe_and_unique():
    ids = ["v_Apply_g01_c01", "a.b", "a_b", "dir/name with space", "ü", "", "x" * 300]
    keys = [sample_key(i) for i in ids]
    assert keys[0] == "v_Apply_g01_c01"  # safe ids are kept
    assert len(set(keys)) == len(keys)
    assert all(k and "." not in k and "/" not in k and " " not in k for k in keys)


def test_offsets_point_at_tar_members_and_shards_roll(tmp_path):
    w = ShardWriter(tmp_path, "train", 3, 5, max_bytes=10_000)
    payloads = {f"vid.{i}/x" if i == 2 else f"vid{i}": bytes([i]) * (3000 + 700 * i) for i in range(6)}
    rows = [w.add(_row(vid, p), p) for vid, p in payloads.items()]
    # full shards are committed as they fill; the open one is only visible as .tmp
    assert sorted((tmp_path / "shards").glob("*.tar")) == sorted(tmp_path / s for s in w.committed)
    assert [p.name for p in (tmp_path / "shards").glob("*.tmp")] == [w.rel_path.split("/")[1] + ".tmp"]
    w.commit()
    shards = sorted(p.name for p in (tmp_path / "shards").glob("*.tar"))
    assert shards[0] == "train-003-000005.tar" and len(shards) >= 2
    assert not list((tmp_path / "shards").glob("*.tmp"))
    for row in rows:
        payload = payloads[row["video_id"]]
        path = tmp_path / row["shard"]
        assert path.stat().st_size <= 10_000 + 10240  # bound + tar end-of-archive record
        with tarfile.open(path) as tar:
            members = {m.name: m for m in tar.getmembers()}
        key = sample_key(row["video_id"])
        assert members[f"{key}.json"].offset == row["offset"]
        assert members[f"{key}.jpgs"].offset_data == row["jpgs_offset"]
        with open(path, "rb") as f:
            f.seek(row["jpgs_offset"])
            assert f.read(len(payload)) == payload
        # the record (commit point) holds the row
        rec = pq.read_table(tmp_path / "manifests" / "_parts" / row["shard"].split("/")[1].replace(".tar", ".parquet"))
        assert row["video_id"] in rec.column("video_id").to_pylist()
    got = {json.loads(s["json"])["video_id"]: s["jpgs"] for s in wds.WebDataset(
        [str(tmp_path / "shards" / s) for s in shards], shardshuffle=False)}
    assert got == payloads


def test_abort_leaves_no_partial_shard(tmp_path):
    w = ShardWriter(tmp_path, "val", 0, 0, max_bytes=1 << 20)
    w.add(_row("a", b"xy"), b"xy")
    w.abort()
    assert list((tmp_path / "shards").iterdir()) == []
    assert not (tmp_path / "manifests").exists()
