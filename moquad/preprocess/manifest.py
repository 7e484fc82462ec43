"""Manifest schema (docs/reference/manifest_schema.md), atomic Parquet I/O, readers and ``verify``.

Per-part progress lives in ``DIR/manifests/_parts/``: one record per committed shard
(``{split}-{part:03d}-{n:06d}.parquet``), that shard's error rows (``errors-{split}-{part:03d}-{n:06d}.parquet``),
the error rows known from the listing (``errors-_listing-{part:03d}-000000.parquet``),
the part's settings (``config-{part:03d}.json``) and, once a part finished, ``done-{part:03d}.json``.
Merging concatenates the records into ``manifests/{split}.parquet`` and ``errors.parquet``. The leading ``_``
keeps the records (and the parts' JSON) out of ``pyarrow.dataset.dataset(DIR/manifests)``, Spark and Hive, which
skip ``_`` and ``.`` names; datasets written before (``manifests/parts/``) are read as they are and moved to the
new name by the next writer (:func:`migrate_parts`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from moquad import objstore
from moquad.data.store import ERRORS_SCHEMA, MANIFEST_SCHEMA, read_errors, read_info, read_manifest
from moquad.io import atomic_write_bytes
from moquad.objstore import Location

# fields of a manifest row that only the shard writer knows (not in the sample's .json)
WRITER_FIELDS = ("shard", "offset", "jpgs_offset")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sample_key(video_id: str) -> str:
    """A tar/webdataset-safe key (no '.', '/', spaces); a short hash keeps rewritten ids unique."""
    key = _UNSAFE.sub("_", video_id)
    if key != video_id or not key:
        key = f"{key}_{hashlib.sha1(video_id.encode('utf-8')).hexdigest()[:8]}"
    return key


def write_table(table: pa.Table, path: str | Path) -> None:
    """Write Parquet atomically (temp file + fsync + rename)."""
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    atomic_write_bytes(path, memoryview(buf.getvalue()))


def write_json(obj: Any, path: str | Path) -> None:
    """Write JSON atomically."""
    atomic_write_bytes(path, json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8"))


PARTS = "_parts"  # manifests/_parts: the per-part records
OLD_PARTS = "parts"  # its name before: still read


def parts_dir(data_dir: str | Path) -> Path:
    """Where the per-part records are written (``DIR/manifests/_parts``)."""
    return Path(data_dir) / "manifests" / PARTS


def migrate_parts(data_dir: str | Path) -> None:
    """A writer of a folder made by an older moquad moves ``manifests/parts`` to ``manifests/_parts`` (one rename),
    so the records stay in one place; a folder with both (never made by moquad) is left as it is."""
    old, new = Path(data_dir) / "manifests" / OLD_PARTS, parts_dir(data_dir)
    if old.is_dir() and not new.exists():
        try:
            os.replace(old, new)
        except FileNotFoundError:  # another part of the job (--num-parts on shared storage) moved it first
            pass


def write_record(data_dir: str | Path, split: str, part: int, index: int, rows: list[dict[str, Any]]) -> None:
    """Record the manifest rows of one committed shard (the commit point of that shard)."""
    table = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)
    write_table(table, parts_dir(data_dir) / f"{split}-{part:03d}-{index:06d}.parquet")


def write_error_record(data_dir: str | Path, stem: str, rows: list[dict[str, Any]]) -> None:
    """The error rows of shard ``stem`` (``{split}-{part:03d}-{n:06d}``), or of a part's listing (``_listing-{part:03d}-000000``)."""
    write_table(pa.Table.from_pylist(rows, schema=ERRORS_SCHEMA), parts_dir(data_dir) / f"errors-{stem}.parquet")


def read_records(data_dir: str | Path, part: int | None = None) -> tuple[pa.Table, pa.Table]:
    """All committed manifest rows and error rows (of one part, or of all parts)."""
    pdir = parts_dir(data_dir)
    pdir = pdir if pdir.is_dir() else Path(data_dir) / "manifests" / OLD_PARTS  # a folder not migrated yet
    pat = "*" if part is None else f"*-{part:03d}-*"
    ok, bad = [], []
    for f in sorted(pdir.glob(f"{pat}.parquet")) if pdir.is_dir() else []:
        (bad if f.name.startswith("errors-") else ok).append(pq.read_table(f))
    ok_t = pa.concat_tables(ok).cast(MANIFEST_SCHEMA) if ok else MANIFEST_SCHEMA.empty_table()
    bad_t = pa.concat_tables(bad).cast(ERRORS_SCHEMA) if bad else ERRORS_SCHEMA.empty_table()
    return ok_t, bad_t


# ---------------------------------------------------------------- verify


def _check_sample(
    problems: list[str], shard: str, row: dict[str, Any], json_m: tarfile.TarInfo | None,
    jpgs_m: tarfile.TarInfo | None, f: Any,
) -> None:
    vid = row["video_id"]
    where = f"{shard}: {vid}"
    if json_m is None or jpgs_m is None:
        problems.append(f"{where}: sample missing its {'.json' if json_m is None else '.jpgs'} member")
        return
    if row["offset"] != min(json_m.offset, jpgs_m.offset):
        problems.append(f"{where}: offset {row['offset']} in manifest, {min(json_m.offset, jpgs_m.offset)} in shard")
    if row["jpgs_offset"] != jpgs_m.offset_data:
        problems.append(f"{where}: jpgs_offset {row['jpgs_offset']} in manifest, {jpgs_m.offset_data} in shard")
    if row["jpgs_size"] != jpgs_m.size:
        problems.append(f"{where}: jpgs_size {row['jpgs_size']} in manifest, {jpgs_m.size} in shard")
    f.seek(json_m.offset_data)
    try:
        meta = json.loads(f.read(json_m.size).decode("utf-8"))
        expect = {k: v for k, v in row.items() if k not in WRITER_FIELDS and not (k == "xxh3" and v is None)}
        if meta != expect:
            bad = sorted(k for k in set(meta) | set(expect) if meta.get(k) != expect.get(k))
            problems.append(f"{where}: sample .json disagrees with the manifest row on {', '.join(bad)}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        problems.append(f"{where}: sample .json is not valid UTF-8 JSON")
    f.seek(jpgs_m.offset_data)
    payload = f.read(jpgs_m.size)
    if hashlib.sha256(payload).hexdigest() != row["checksum"] or \
            (row.get("xxh3") and xxhash.xxh3_128_hexdigest(payload) != row["xxh3"]):
        problems.append(f"{where}: checksum mismatch (payload corrupted)")
    fo = row["frame_offsets"]
    if len(fo) != row["num_frames"] + 1 or row["num_frames"] < 1:
        problems.append(f"{where}: {len(fo)} frame offsets for num_frames={row['num_frames']}")
        return
    if fo[0] != 0 or fo[-1] != len(payload) or any(b <= a for a, b in zip(fo, fo[1:])):
        problems.append(f"{where}: frame_offsets are not increasing from 0 to jpgs_size")
        return
    for i in range(row["num_frames"]):
        if payload[fo[i] : fo[i] + 2] != b"\xff\xd8" or payload[fo[i + 1] - 2 : fo[i + 1]] != b"\xff\xd9":
            problems.append(f"{where}: frame {i} is not a complete JPEG at its byte range")
            return


def _check_manifests(problems: list[str], data_dir: Location, info: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Check each split's manifest (row count, duplicate ids, split, labels); return shard -> key -> row."""
    rows_by_shard: dict[str, dict[str, dict[str, Any]]] = {}
    seen: set[str] = set()
    classes = info.get("classes", [])
    for split, n in info.get("splits", {}).items():
        try:
            table = read_manifest(data_dir, split)
        except FileNotFoundError as e:
            problems.append(str(e))
            continue
        if table.num_rows != n:
            problems.append(f"dataset.json says {n} {split} videos, manifests/{split}.parquet has {table.num_rows}")
        for row in table.to_pylist():
            if row["video_id"] in seen:
                problems.append(f"video {row['video_id']} appears more than once in the manifests")
            seen.add(row["video_id"])
            _check_row(problems, split, row, classes)
            rows_by_shard.setdefault(row["shard"], {})[sample_key(row["video_id"])] = row
    for vid in sorted(seen & set(read_errors(data_dir).column("video_id").to_pylist())):
        problems.append(f"video {vid} is both in a manifest and in errors.parquet")
    return rows_by_shard


def _check_row(problems: list[str], split: str, row: dict[str, Any], classes: list[str]) -> None:
    """A manifest row's split and label agree with its manifest and dataset.json."""
    if row["split"] != split:
        problems.append(f"video {row['video_id']} in manifests/{split}.parquet has split {row['split']!r}")
    label = row["label"]
    if label >= len(classes) or label < -1 or (label >= 0 and row["class_name"] != classes[label]):
        problems.append(f"video {row['video_id']}: label {label} / class {row['class_name']!r} does not "
                        "match dataset.json classes")


def _check_shard_files(problems: list[str], data_dir: Location, rows_by_shard: dict[str, dict]) -> set[str]:
    """Leftover temp files, shards the manifests name but the disk lacks, and the reverse; returns shards on both."""
    listed = objstore.listdir(objstore.join(data_dir, "shards"))
    on_disk = {f"shards/{name}" for name in listed if name.endswith(".tar")}
    for leftover in sorted(name for name in listed if name.endswith(".tmp") or ".partial-" in name):  # objstore.upload
        problems.append(f"leftover temp file shards/{leftover} (an interrupted run; re-run preprocess)")
    for shard in sorted(set(rows_by_shard) - on_disk):
        problems.append(f"missing shard {shard} ({len(rows_by_shard[shard])} videos in the manifest)")
    for shard in sorted(on_disk - set(rows_by_shard)):
        problems.append(f"orphan shard {shard} (not in any manifest)")
    return set(rows_by_shard) & on_disk


def _open_shard(data_dir: Location, shard: str) -> Any:
    """A local shard as a file; a remote one read whole into memory (verify reads every byte anyway)."""
    loc = objstore.join(data_dir, shard)
    return io.BytesIO(objstore.read_all(loc)) if objstore.is_url(loc) else open(loc, "rb")  # noqa: SIM115


def _check_shard(problems: list[str], data_dir: Location, shard: str, rows: dict[str, dict[str, Any]]) -> None:
    """Every sample of one shard against its manifest row; orphan and missing samples."""
    members: dict[str, dict[str, tarfile.TarInfo]] = {}
    try:
        f = _open_shard(data_dir, shard)
        with tarfile.open(fileobj=f, mode="r:") as tar:
            for m in tar:
                key, _, ext = m.name.partition(".")
                members.setdefault(key, {})[ext] = m
    except (tarfile.TarError, OSError) as e:
        problems.append(f"{shard}: unreadable tar ({e})")
        return
    for key in sorted(set(members) - set(rows)):
        problems.append(f"{shard}: orphan sample {key} (not in the manifest)")
    with f:
        for key, row in rows.items():
            if key not in members:
                problems.append(f"{shard}: missing sample {key} ({row['video_id']})")
                continue
            _check_sample(problems, shard, row, members[key].get("json"), members[key].get("jpgs"), f)


def verify(data_dir: Location) -> list[str]:
    """Re-read every shard and check it against the manifests; returns problems (empty = ok).

    Checks offsets, sizes, checksums (sha256 and xxh3), frame index (count, bounds, JPEG markers),
    sample JSON vs manifest row, labels vs classes, duplicate ids, ids also in errors.parquet,
    missing shards/samples and orphan shards/samples, split sizes in dataset.json and leftover
    temp files.
    """
    data_dir = data_dir if objstore.is_url(data_dir) else Path(data_dir)
    problems: list[str] = []
    info = read_info(data_dir)  # no dataset there (a wrong path, a missing bucket) is one error line, not a problem
    rows_by_shard = _check_manifests(problems, data_dir, info)
    for shard in sorted(_check_shard_files(problems, data_dir, rows_by_shard)):
        _check_shard(problems, data_dir, shard, rows_by_shard[shard])
    return problems
