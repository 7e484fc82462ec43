"""Ending cleanly at exit: Arrow never holds the last reference to a Python object.

The abort it prevents: ``moquad extract`` printed its ``error:`` line, then ``terminate called without an active
exception`` and died of SIGABRT. The core dump showed an Arrow pool thread finishing a Parquet scan of
``pa.BufferReader(bytes)`` after the read had returned: it dropped the last reference to the scanned source,
``~PyBuffer`` asked for the GIL, and CPython 3.11 ends a thread that asks for the GIL while the interpreter
exits with ``pthread_exit``, whose forced unwind through that noexcept destructor calls ``std::terminate``.
Rare and load-dependent, so no test can wait for it; these tests check the mechanism instead: every read of
bytes that Python holds gives Arrow a copy Arrow owns (``moquad.data.store.arrow_owned``), so nothing an
Arrow thread releases needs Python.
"""

from __future__ import annotations

import io
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moquad.data import store


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_arrow_owned_copies_the_bytes_and_keeps_no_reference():
    raw = b"moquad manifest bytes " * 1000
    before = sys.getrefcount(raw)
    borrowed = pa.BufferReader(raw)
    assert sys.getrefcount(raw) > before  # what HEAD gave Arrow: a reader that keeps the Python bytes alive
    del borrowed
    reader = store.arrow_owned(raw)
    assert sys.getrefcount(raw) == before
    assert reader.read() == raw


ERRORS = pa.table({"source_path": ["raw/a.avi", "raw/b.avi"], "video_id": ["a", "b"], "split": ["train", "test"],
                   "reason": ["ffmpeg: moov atom not found", "no frames"]})
MANIFEST = pa.table({
    "video_id": ["v_a", "v_b"], "split": ["train", "train"], "label": [0, 3], "class_name": ["Run", "Jump"],
    "source_path": ["raw/a.avi", "raw/b.avi"], "shard": ["shards/train-0-000000.tar"] * 2, "offset": [0, 4096],
    "jpgs_offset": [512, 4608], "jpgs_size": [3000, 2000], "num_frames": [2, 1], "fps": [25.0, 30.0],
    "width": [40, 32], "height": [32, 32], "frame_offsets": [[0, 1500, 3000], [0, 2000]], "checksum": ["c1", "c2"],
    "xxh3": ["x1", "x2"]}, schema=store.MANIFEST_SCHEMA)


@pytest.mark.parametrize("reader, entry, table", [
    (lambda: store.read_errors("s3://bucket/ds"), "read_table", ERRORS),
    (lambda: store.read_manifest("s3://bucket/ds", "train"), "ParquetFile", MANIFEST),
])
def test_reads_of_bytes_give_arrow_no_python_object(monkeypatch, reader, entry, table):
    """errors.parquet and a manifest on a store arrive as bytes; while Arrow's source is alive, the bytes are not
    referenced by it (HEAD: ``pq.read_table(pa.BufferReader(raw))`` and ``pq.ParquetFile(pa.BufferReader(raw))``)."""
    raw = parquet_bytes(table)
    monkeypatch.setattr(store, "_read", lambda path, what: raw)
    sources: list = []
    real = getattr(pq, entry)
    monkeypatch.setattr(pq, entry, lambda source, *a, **kw: sources.append(source) or real(source, *a, **kw))
    before = sys.getrefcount(raw)
    got = reader()
    assert len(sources) == 1 and sys.getrefcount(raw) == before  # the source Arrow read is alive in `sources`
    assert got.select(table.column_names).cast(table.schema).to_pylist() == table.to_pylist()
