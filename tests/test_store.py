"""The manifest reader at scale: flat arrays without Python objects, the cached frame index, the fast checksum."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest
from video_fixtures import coded_video, write_frames

from moquad.data import index_cache, store


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    return write_frames(root, ((f"v{i:02d}", coded_video(i, 3 + i % 7), i % 3) for i in range(20)),
                        classes=["a", "b", "c"], videos_per_shard=6)


def _reference_checksum(table: pa.Table) -> str:
    """The documented formula, row by row: sha256 over json.dumps([video_id, label, class_name, checksum, frames])."""
    h = hashlib.sha256()
    for row in zip(*(table.column(c).to_pylist() for c in ("video_id", "label", "class_name", "checksum", "num_frames"))):
        h.update((json.dumps(row) + "\n").encode())
    return h.hexdigest()


def test_split_arrays_hold_no_python_objects(data):
    """Forked workers share the arrays copy-on-write: none may hold Python objects (their refcounts would copy)."""
    split = store.Split(data)
    table = store.read_manifest(data, "train")
    arrays = {k: v for k, v in vars(split).items() if isinstance(v, np.ndarray)}
    assert arrays and all(a.dtype != object for a in arrays.values())
    assert split.video_id.tolist() == table.column("video_id").to_pylist()
    assert split.class_name.tolist() == table.column("class_name").to_pylist()
    assert [split.shards[s] for s in split.shard] == table.column("shard").to_pylist()
    assert split._fo.dtype == np.uint32
    for i, offsets in enumerate(table.column("frame_offsets").to_pylist()):
        assert split.frame_offsets(i).tolist() == offsets
    assert split.checksum_value == _reference_checksum(table)


def test_frame_index_is_cached_and_memory_mapped(data, tmp_path, monkeypatch):
    """A big frame index is decoded once into the cache and memory-mapped by every later reader; same offsets."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setattr(index_cache, "INDEX_CACHE_FRAMES", 0)
    first = store.Split(data)
    files = list((tmp_path / "frame-index").glob("*.npy"))  # and its .used stamp
    assert len(files) == 1 and isinstance(first._fo, np.memmap)
    monkeypatch.setattr(store, "_decode_index", lambda *a: pytest.fail("decoded again"))
    again = store.Split(data)
    assert isinstance(again._fo, np.memmap)
    ref = store.read_manifest(data, "train").column("frame_offsets").to_pylist()
    assert [again.frame_offsets(i).tolist() for i in range(len(again))] == ref
    assert again.payload(3) == first.payload(3)


@pytest.mark.parametrize("ids,names", [(["a", "b c"], ["x", "y"]), (['q"uote', "é"], ["back\\slash", "\n"]), ([], [])])
def test_manifest_checksum_matches_the_row_by_row_formula(ids, names):
    """Plain ASCII rows take Arrow's fast path, anything JSON escapes the row loop: the same bytes either way."""
    table = pa.table({"video_id": pa.array(ids, pa.string()), "label": pa.array(range(len(ids)), pa.int32()),
                      "class_name": pa.array(names, pa.string()), "checksum": pa.array(["ab"] * len(ids), pa.string()),
                      "num_frames": pa.array([7] * len(ids), pa.int32())})
    assert store.manifest_checksum(table) == _reference_checksum(table)
