"""Manifest readers and ``verify``: a clean dataset passes, every kind of damage is reported."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest
from test_preprocess_layouts import make_ucf101
from video_fixtures import shard_paths

from moquad.config import PreprocessConfig
from moquad.data import store
from moquad.preprocess import manifest as M
from moquad.preprocess.run import preprocess


@pytest.fixture(scope="module")
def clean(real_videos_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    make_ucf101(root, real_videos_dir, with_broken=False)
    out = tmp_path_factory.mktemp("out") / "d"
    preprocess(PreprocessConfig(dataset="ucf101", root=str(root), out=str(out), short_side=32, workers=1,
                                shard_size=300_000), quiet=True)
    return out


@pytest.fixture
def copy(clean, tmp_path):
    dst = tmp_path / "d"
    shutil.copytree(clean, dst)
    return dst


def test_readers_and_schema(clean):
    info = store.read_info(clean)
    assert info["schema_version"] == store.SCHEMA_VERSION and info["name"] == "ucf101"
    table = store.read_manifest(clean, "train")
    assert table.schema.equals(store.MANIFEST_SCHEMA)
    assert table.num_rows == info["splits"]["train"]
    paths = shard_paths(clean, "train")
    assert paths == sorted(paths) and all(p.is_file() and p.name.startswith("train-000-") for p in paths)
    assert store.read_errors(clean).num_rows == 0
    with pytest.raises(FileNotFoundError, match="available: test, train"):
        store.read_manifest(clean, "val")
    with pytest.raises(FileNotFoundError, match="run `moquad preprocess"):
        store.read_info(clean / "nope")
    assert M.verify(clean) == []


def _first(out, split="train"):
    return store.read_manifest(out, split).to_pylist()[0]


def test_verify_detects_corrupted_payload(copy):
    row = _first(copy)
    with open(copy / row["shard"], "r+b") as f:
        f.seek(row["jpgs_offset"] + row["frame_offsets"][1] + 50)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    problems = M.verify(copy)
    assert len(problems) == 1 and "checksum mismatch" in problems[0] and row["video_id"] in problems[0]


def test_verify_detects_wrong_offsets_and_frame_index(copy):
    table = store.read_manifest(copy, "train")
    rows = table.to_pylist()
    rows[0]["jpgs_offset"] += 512
    rows[1]["frame_offsets"] = rows[1]["frame_offsets"][:-1]
    M.write_table(pa.Table.from_pylist(rows, schema=store.MANIFEST_SCHEMA), copy / "manifests" / "train.parquet")
    problems = "\n".join(M.verify(copy))
    assert "jpgs_offset" in problems and rows[0]["video_id"] in problems
    assert "frame offsets for num_frames" in problems or "disagrees" in problems


def test_verify_detects_missing_orphan_and_leftovers(copy):
    shards = shard_paths(copy, "train")
    shards[0].unlink()
    shutil.copy(shards[1], copy / "shards" / "train-009-000000.tar")
    (copy / "shards" / "test-000-000007.tar.tmp").write_bytes(b"half")
    problems = "\n".join(M.verify(copy))
    assert f"missing shard shards/{shards[0].name}" in problems
    assert "orphan shard shards/train-009-000000.tar" in problems
    assert "leftover temp file" in problems


def test_verify_detects_dropped_and_duplicated_rows(copy):
    rows = store.read_manifest(copy, "train").to_pylist()
    M.write_table(pa.Table.from_pylist(rows[2:] + rows[2:3], schema=store.MANIFEST_SCHEMA),
                  copy / "manifests" / "train.parquet")
    problems = "\n".join(M.verify(copy))
    assert "orphan" in problems  # dropped rows: their samples (or whole shard) are not in the manifest
    assert "more than once" in problems
    info = json.loads((copy / "dataset.json").read_text())
    assert f"says {info['splits']['train']} train videos" in problems


def test_verify_detects_labels_outside_the_classes(copy):
    rows = store.read_manifest(copy, "test").to_pylist()
    rows[0]["label"] = 7
    M.write_table(pa.Table.from_pylist(rows, schema=store.MANIFEST_SCHEMA), copy / "manifests" / "test.parquet")
    problems = "\n".join(M.verify(copy))
    assert "label 7" in problems and "does not match dataset.json classes" in problems


def test_other_tools_read_the_manifests_unchanged(tmp_path):
    """The manifests are the dataset's index for other tools too: DuckDB (the README's query: frames per class) and
    pyarrow.dataset read them as written, and agree with what was written."""
    import duckdb
    import pyarrow.dataset as ds
    from video_fixtures import coded_video, write_frames

    classes = ["jump", "run", "swim"]
    lengths = {f"v{i:02d}": (4 + i % 5, i % 3) for i in range(12)}  # video -> (frames, label)
    for split, ids in (("train", list(lengths)[:9]), ("val", list(lengths)[9:])):
        write_frames(tmp_path, ((v, coded_video(i, lengths[v][0], 8, 8), lengths[v][1]) for i, v in enumerate(ids)),
                     split=split, classes=classes, videos_per_shard=4)
    expect: dict[str, list[int]] = {}
    for v in list(lengths)[:9]:
        frames, label = lengths[v]
        got = expect.setdefault(classes[label], [0, 0])
        got[0], got[1] = got[0] + frames, got[1] + 1
    query = (f"SELECT class_name, sum(num_frames) AS frames, count(*) AS videos "
             f"FROM read_parquet('{tmp_path}/manifests/train.parquet') GROUP BY class_name ORDER BY class_name")
    rows = duckdb.connect().execute(query).fetchall()
    assert rows == [(c, f, n) for c, (f, n) in sorted(expect.items())]
    both = ds.dataset([str(tmp_path / "manifests" / f"{s}.parquet") for s in ("train", "val")], format="parquet")
    table = both.to_table(columns=["video_id", "split", "num_frames", "frame_offsets"])
    assert sorted(table.column("video_id").to_pylist()) == sorted(lengths)
    assert {r["video_id"]: r["num_frames"] for r in table.to_pylist()} == {v: f for v, (f, _) in lengths.items()}
    assert all(len(r["frame_offsets"]) == r["num_frames"] + 1 for r in table.to_pylist())
    assert both.count_rows(filter=ds.field("split") == "val") == 3


@pytest.fixture
def synth_copy(synth_root, tmp_path):
    """A preprocessed copy of the synthetic UCF101 layout (no real clips needed)."""
    out = tmp_path / "d"
    preprocess(PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(out), short_side=32, workers=1),
               quiet=True)
    return out


def test_the_manifests_folder_is_a_dataset_for_pyarrow_and_duckdb(synth_copy):
    """``pyarrow.dataset.dataset(DIR/manifests)`` opened ``parts/config-000.json`` and failed: the per-part records
    and JSON now live in ``manifests/_parts`` (``_``: skipped by pyarrow, Spark, Hive). The folder opens as is; the
    videos of every split (errors.parquet set aside) are each read once, by pyarrow and by DuckDB."""
    import duckdb
    import pyarrow.dataset as ds

    folder = synth_copy / "manifests"
    want = sorted(v for s in ("train", "test")
                  for v in store.read_manifest(synth_copy, s).column("video_id").to_pylist())
    assert (folder / "_parts" / "config-000.json").is_file() and not (folder / "parts").exists()
    whole = ds.dataset(folder)  # the default discovery: no JSON, no per-part record
    assert sorted(p.rsplit("/", 1)[1] for p in whole.files) == ["errors.parquet", "test.parquet", "train.parquet"]
    whole.to_table()
    videos = ds.dataset(folder, ignore_prefixes=["_", ".", "errors"]).to_table()
    assert videos.schema.equals(store.MANIFEST_SCHEMA) and sorted(videos.column("video_id").to_pylist()) == want
    rows = duckdb.connect().execute(f"SELECT video_id FROM read_parquet('{folder}/*.parquet', union_by_name=true) "
                                    "WHERE shard IS NOT NULL").fetchall()
    assert sorted(r[0] for r in rows) == want


def test_a_dataset_with_the_old_parts_folder_is_read_and_moved_by_the_next_merge(synth_copy):
    """Datasets written before keep ``manifests/parts``: its records are read, and a merge moves the folder."""
    from moquad.preprocess.run import merge

    (synth_copy / "manifests" / "_parts").rename(synth_copy / "manifests" / "parts")
    ok, _ = M.read_records(synth_copy)
    assert ok.num_rows == sum(store.read_manifest(synth_copy, s).num_rows for s in ("train", "test")) > 0
    merge(synth_copy, quiet=True)
    folder = synth_copy / "manifests"
    assert (folder / "_parts" / "done-000.json").is_file() and not (folder / "parts").exists()
    assert M.verify(synth_copy) == []
