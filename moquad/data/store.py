"""The one reader of the on-disk format: ``dataset.json``, the manifests, a sample's bytes and frames.

Written by ``moquad preprocess`` (schema in ``docs/reference/manifest_schema.md``); read here by the loader,
feature extraction, the linear probe, fine-tuning, ``cam``, ``info`` and ``verify``.

A :class:`Split` holds one split's manifest as flat numpy arrays without Python objects (forked DataLoader
workers share them copy-on-write; a big frame index is a memory-mapped cache file every process of a node
shares, :mod:`moquad.data.index_cache`) and reads by offset: a sample is ONE read of ``(shard, jpgs_offset, jpgs_size)``
(:func:`read_bytes`, the single place that touches sample bytes: a ``pread`` locally, ONE ranged GET
on an object store, see :mod:`moquad.objstore`), checked against its xxh3; a frame is one read of its
byte range. ``data_dir`` is a folder or a URL (``s3://bucket/prefix``, ``gs://``, ``http(s)://``). The manifest is the dataset: files it
does not name are never opened, and a shard it names that is missing or too short is an error at
start-up (:meth:`Split.check_shards`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import simplejpeg
import xxhash

from moquad import objstore
from moquad.data import index_cache
from moquad.errors import MoquadError
from moquad.objstore import Location, join

SCHEMA_VERSION = 2  # the version this moquad writes and reads
MANIFEST_SCHEMA = pa.schema(
    [
        ("video_id", pa.string()),
        ("split", pa.string()),
        ("label", pa.int32()),
        ("class_name", pa.string()),
        ("source_path", pa.string()),
        ("shard", pa.string()),
        ("offset", pa.int64()),
        ("jpgs_offset", pa.int64()),
        ("jpgs_size", pa.int64()),
        ("num_frames", pa.int32()),
        ("fps", pa.float32()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("frame_offsets", pa.list_(pa.int64())),
        ("checksum", pa.string()),  # sha256 of the payload (provenance; verify checks it too)
        ("xxh3", pa.string()),  # xxh3-128 of the payload: checked on every read by the loader (~50x cheaper)
    ]
)
ERRORS_SCHEMA = pa.schema(
    [("source_path", pa.string()), ("video_id", pa.string()), ("split", pa.string()), ("reason", pa.string())]
)


class BadSample(Exception):
    """A sample whose bytes cannot be used (checksum mismatch, short read, undecodable JPEG)."""


# ---------------------------------------------------------------- dataset.json and manifests


def _read(path: Location, what: str) -> bytes:
    """A whole metadata file of the dataset; a store that stays unreachable is one error line."""
    try:
        return objstore.read_all(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise MoquadError(f"cannot read {path} ({str(e).splitlines()[0]}); check the URL, the network "
                          f"and the store's credentials (standard environment / config chain) for {what}") from None


def read_info(data_dir: Location) -> dict[str, Any]:
    """``dataset.json`` (name, classes, split sizes, settings), refusing other schema versions."""
    path = join(data_dir, "dataset.json")
    try:
        raw = _read(path, "dataset.json")
    except FileNotFoundError:
        if hint := _not_a_dataset(data_dir, []):  # the shards/ folder or raw videos: say which
            raise FileNotFoundError(f"{path} not found{hint}") from None
        raise FileNotFoundError(f"{path} not found; run `moquad preprocess ... --out {data_dir}` first "
                                "(or `--merge` when the parts ran separately)") from None
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MoquadError(f"{path} is not valid JSON ({e}); re-run `moquad preprocess ... --merge`") from None
    if info.get("schema_version") != SCHEMA_VERSION:
        raise MoquadError(f"{path} has schema version {info.get('schema_version')}, this moquad reads "
                          f"{SCHEMA_VERSION}; re-run `moquad preprocess` with this version")
    return info


def classes(data_dir: Location) -> list[str]:
    """Class names in label order."""
    return list(read_info(data_dir).get("classes") or [])


def arrow_owned(raw: bytes) -> pa.BufferReader:
    """A reader over a copy of ``raw`` that Arrow owns (:func:`moquad.objstore.arrow_copy`: why)."""
    return pa.BufferReader(objstore.arrow_copy(raw))


def _parquet(path: Location) -> pa.Table:
    return pq.read_table(arrow_owned(_read(path, "the manifests")))


def _manifest_file(data_dir: Location, split: str) -> tuple[Location, pq.ParquetFile, str]:
    """``manifests/{split}.parquet`` opened (a local file memory-mapped, not read whole), its columns checked, and
    the file's identity (path, size, mtime and inode; on a store, its bytes' hash) for caches derived from it."""
    path = join(data_dir, "manifests", f"{split}.parquet")
    try:
        if objstore.is_url(path):
            raw = _read(path, "the manifests")
            file, ident = pq.ParquetFile(arrow_owned(raw)), xxhash.xxh3_128_hexdigest(raw)
        else:
            st = os.stat(path)
            file = pq.ParquetFile(str(path), memory_map=True)
            ident = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    except FileNotFoundError:
        have = sorted(n[: -len(".parquet")] for n in objstore.listdir(join(data_dir, "manifests"))
                      if n.endswith(".parquet") and n != "errors.parquet")
        raise FileNotFoundError(f"no manifest for split {split!r} in {data_dir}; "
                                f"available: {', '.join(have) or 'none'}{_not_a_dataset(data_dir, have)}") from None
    missing = [c for c in MANIFEST_SCHEMA.names if c not in file.schema_arrow.names]
    if missing:
        raise MoquadError(f"{path} lacks the columns {', '.join(missing)}; re-run `moquad preprocess` with this version")
    return path, file, xxhash.xxh3_128_hexdigest(ident.encode())


def _not_a_dataset(data_dir: Location, have: list[str]) -> str:
    """The end of the no-manifest message when ``data_dir`` is a local folder that is not a dataset but looks like
    what users pass by mistake: the ``shards/`` folder of one, or a folder of raw videos: a known dataset's layout
    (its ``moquad preprocess`` command named), else a file whose MIME type, as the system's table knows it, is
    video/*, up to two folders down (``preprocess folder``)."""
    import mimetypes

    from moquad.preprocess.datasets import DATASETS, raw_layout  # here: preprocess sits above data

    folder = Path(str(data_dir))
    if have or objstore.is_url(data_dir) or not folder.is_dir():
        return ""
    if (folder.parent / "manifests").is_dir() and any(folder.glob("*.tar")):
        return f"; this is the shards/ folder of a dataset: pass its parent, --data {folder.parent}"
    dataset = raw_layout(folder)
    files = [p for pattern in ("*", "*/*", "*/*/*") for p in folder.glob(pattern)] if dataset is None else []
    if dataset is None and any((mimetypes.guess_type(p.name)[0] or "").startswith("video/") for p in files[:10000]):
        dataset = "folder"
    if dataset is None:
        return ""
    split = f" --official-split {DATASETS[dataset].official_splits[0]}" if DATASETS[dataset].official_splits else ""
    what = "raw videos" if dataset == "folder" else f"{dataset}'s raw layout"
    return (f"; this looks like {what}: run `moquad preprocess {dataset} {folder} --out OUT{split}` first, then "
            "pass --data OUT")


def read_manifest(data_dir: Location, split: str, columns: Sequence[str] | None = None) -> pa.Table:
    """The merged manifest of ``split`` (one row per video); ``columns``: only those (all by default)."""
    names = list(columns or MANIFEST_SCHEMA.names)
    table = _manifest_file(data_dir, split)[1].read(columns=names)
    return table.select(names).cast(pa.schema([MANIFEST_SCHEMA.field(n) for n in names]))


def read_errors(data_dir: Location) -> pa.Table:
    """``manifests/errors.parquet`` (inputs that were not written, with the reason); empty when absent."""
    try:
        return _parquet(join(data_dir, "manifests", "errors.parquet")).cast(ERRORS_SCHEMA)
    except FileNotFoundError:
        return ERRORS_SCHEMA.empty_table()


CHECKSUM_COLUMNS = ("video_id", "label", "class_name", "checksum", "num_frames")
_PLAIN = r"^[ !#-\[\]-~]*$"  # printable ASCII but '"' and '\\': json.dumps writes such a string as "<it>"


def manifest_checksum(table: pa.Table) -> str:
    """sha256 over the rows' (video_id, label, class_name, payload checksum, num_frames).

    Identifies the data content independently of how the Parquet file was written or where the
    shards live, so a re-merged manifest of the same videos keeps caches valid. Each row is hashed as
    ``json.dumps([...]) + "\\n"``; rows of plain ASCII (every real dataset) are formatted by Arrow in one pass
    (1M rows in ~1 s instead of ~8 s), anything else row by row, to the same bytes.
    """
    t = table.select(list(CHECKSUM_COLUMNS)).combine_chunks()
    h = hashlib.sha256()
    text = _json_rows(t)
    if text is None:
        for row in zip(*(t.column(c).to_pylist() for c in CHECKSUM_COLUMNS)):
            h.update(json.dumps(row).encode())
            h.update(b"\n")
        return h.hexdigest()
    ends = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset : text.offset + len(text) + 1]
    if len(text):
        h.update(memoryview(text.buffers()[2])[int(ends[0]) : int(ends[-1])])
    return h.hexdigest()


def _json_rows(t: pa.Table) -> pa.Array | None:
    """Every row as its ``json.dumps`` line (one large_string array), or None when a value needs JSON escapes."""
    strings = [t.column(c) for c in ("video_id", "class_name", "checksum")]
    ints = [t.column(c) for c in ("label", "num_frames")]
    if any(c.null_count for c in [*strings, *ints]) or \
            not all(pc.all(pc.match_substring_regex(c, _PLAIN)).as_py() in (True, None) for c in strings):
        return None
    vid, cls, cks = (pc.cast(c, pa.large_string()) for c in strings)
    label, frames = (pc.cast(c, pa.large_string()) for c in ints)
    parts = [pa.scalar(x, pa.large_string()) if isinstance(x, str) else x
             for x in ('["', vid, '", ', label, ', "', cls, '", "', cks, '", ', frames, "]\n", "")]
    return pc.binary_join_element_wise(*parts).combine_chunks()


# ---------------------------------------------------------------- bytes and frames


def read_bytes(path: Location, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` at ``offset``: ONE read (``pread``, or one ranged GET on a store).

    A store's transient failures are retried inside (:func:`moquad.objstore.with_retries`); what
    stays unreadable is a BadSample, so the loader replaces the sample.
    """
    if offset < 0 or size < 0:
        raise BadSample(f"invalid byte range ({offset}, {size})")
    try:
        data = objstore.read_range(path, offset, size)
    except OSError as e:
        if not objstore.is_url(path):
            raise
        raise BadSample(f"unreadable after retries: {str(e).splitlines()[0][:200]}") from None
    return _checked_length(data, offset, size)


def _checked_length(data: bytes, offset: int, size: int) -> bytes:
    if len(data) != size:
        raise BadSample(f"short read: {len(data)} of {size} bytes at offset {offset}")
    return data


REDUCTIONS = (8, 4, 2, 1)  # libjpeg-turbo's DCT-domain reductions (1/8, 1/4, 1/2, none), the smallest image first


def reduced_hw(hw: tuple[int, int], reduce: int) -> tuple[int, int]:
    """Size of a ``hw`` = (height, width) JPEG decoded at ``1 / reduce``: libjpeg rounds up."""
    return -(-hw[0] // reduce), -(-hw[1] // reduce)


def largest_reduction(hw: tuple[int, int], short_side: int) -> int:
    """The largest of :data:`REDUCTIONS` at which a ``hw`` frame keeps ``short_side`` pixels on its short side."""
    return next((r for r in REDUCTIONS if min(reduced_hw(hw, r)) >= short_side), 1)


def decode_jpeg(data: bytes | memoryview, out: np.ndarray | None = None, reduce: int = 1,
                hw: tuple[int, int] | None = None) -> np.ndarray:
    """One JPEG -> uint8 (H, W, 3) RGB (into ``out`` when given); a broken JPEG raises BadSample.

    ``reduce`` 2, 4 or 8: libjpeg-turbo's scaled decode (inverse DCT of the low frequencies only) of a frame of
    ``hw`` pixels (the manifest's; read from the header when None) -> :func:`reduced_hw` pixels."""
    kw: dict = {"buffer": out} if out is not None else {}
    try:
        if reduce > 1:
            hw = hw or simplejpeg.decode_jpeg_header(data)[:2]
            h, w = reduced_hw(hw, reduce)  # the smallest scale >= these and <= 1 / reduce: exactly 1 / reduce
            kw.update(min_height=h, min_width=w, min_factor=reduce)
        return simplejpeg.decode_jpeg(data, colorspace="RGB", **kw)
    except (ValueError, RuntimeError) as e:
        raise BadSample(f"JPEG decode failed: {e}") from None


def decode_frames(payload: bytes, frame_offsets: Sequence[int], indices: Sequence[int]) -> np.ndarray:
    """Decode frames ``indices`` (any order, repeats decoded once) of a ``.jpgs`` payload -> uint8 (T, H, W, 3)."""
    n = len(frame_offsets) - 1
    view, cache, out = memoryview(payload), {}, []
    for i in (int(i) for i in indices):
        if not 0 <= i < n:
            raise IndexError(f"frame {i} out of range for a video of {n} frames")
        if i not in cache:
            cache[i] = decode_jpeg(view[frame_offsets[i] : frame_offsets[i + 1]])
        out.append(cache[i])
    return np.stack(out)


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64)


def _strings(col: pa.ChunkedArray, kind: type = np.str_) -> np.ndarray:
    """A string column as ONE fixed-width numpy array (``np.str_``, or ``np.bytes_`` for ASCII such as hashes)."""
    if kind is np.bytes_:
        return np.asarray(pc.cast(col, pa.binary()).to_numpy(zero_copy_only=False), dtype=np.bytes_)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.str_).reshape(len(col))


def _dictionary(col: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    """(sorted distinct values, each row's index into them) of a string column, without a Python object per row."""
    enc = pc.dictionary_encode(col).combine_chunks()
    values = enc.dictionary.to_pylist()
    order = np.argsort(np.asarray(values, dtype=object)).astype(np.int64) if values else np.zeros(0, np.int64)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return [values[i] for i in order], rank[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]


def _frame_index(file: pq.ParquetFile, key: str, num_frames: np.ndarray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(every video's ``num_frames + 1`` frame offsets, concatenated, as ``dtype``; where each video's starts).

    A big index (>= :data:`moquad.data.index_cache.INDEX_CACHE_FRAMES`) comes from the node-wide cache
    (:mod:`moquad.data.index_cache`, ``KEY``: the manifest file's identity), memory-mapped: decoded once, then the
    next run and every other rank of the node map the same pages instead of decoding 250M offsets."""
    counts = num_frames + 1
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    total = int(counts.sum())
    if total < index_cache.INDEX_CACHE_FRAMES:
        return _decode_index(file, counts, starts, np.empty(total, dtype=dtype)), starts
    return index_cache.cached_index(key, total, dtype, lambda out: _decode_index(file, counts, starts, out)), starts


def _decode_index(file: pq.ParquetFile, counts: np.ndarray, starts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Fill ``out`` with the frame_offsets column, one row group at a time (its Arrow int64 lists: 2 GB at 1M)."""
    row = 0
    for g in range(file.num_row_groups):
        lists = file.read_row_group(g, columns=["frame_offsets"]).column(0).combine_chunks()
        n = len(lists)
        if not np.array_equal(lists.value_lengths().to_numpy(zero_copy_only=False), counts[row : row + n]):
            raise MoquadError("the manifest's frame_offsets do not hold num_frames + 1 offsets for every video; "
                              "run `moquad verify` and re-run `moquad preprocess`")
        at = int(starts[row]) if n else 0
        out[at : at + int(counts[row : row + n].sum())] = lists.flatten().to_numpy()
        row += n
    return out


class Split:
    """One split's manifest as flat numpy arrays (no Python object per video), with readers of its samples.

    Built for node-scale manifests (1M videos, 250M frames): forked loader workers share these arrays
    copy-on-write and never write them, and no array holds Python objects whose reference counts would copy
    a page per touched video into every worker; frame offsets are a flat uint32 index (relative to each
    payload, so < 4 GiB), read from the Parquet file one row group at a time.
    """

    def __init__(self, data_dir: Location, split: str = "train") -> None:
        _, file, key = _manifest_file(data_dir, split)
        self.data_dir, self.split = data_dir if objstore.is_url(data_dir) else Path(data_dir), split
        self._prefetched: dict[int | tuple[int, int], Future] = {}  # reads in flight (stores; prefetch)
        names = [n for n in MANIFEST_SCHEMA.names if n not in ("frame_offsets", "source_path")]
        table = file.read(columns=names).cast(pa.schema([MANIFEST_SCHEMA.field(n) for n in names]))
        self._checksum_table = table.select(list(CHECKSUM_COLUMNS))  # hashed on first use (checksum_value)
        self.video_id = _strings(table.column("video_id"))
        self.class_name = _strings(table.column("class_name"))
        self.label = _ints(table, "label")
        self.shards, self.shard = _dictionary(table.column("shard"))
        self.offset, self.size = _ints(table, "jpgs_offset"), _ints(table, "jpgs_size")
        self.num_frames, self.height, self.width = _ints(table, "num_frames"), _ints(table, "height"), _ints(table, "width")
        self.xxh3 = _strings(table.column("xxh3"), np.bytes_)
        big = len(self.size) and int(self.size.max()) >= 1 << 32
        self._fo, self._fo_start = _frame_index(file, key, self.num_frames, np.int64 if big else np.uint32)
        self._entry = index_cache.entry_of(self._fo)  # a cache entry: kept stamped while this split reads it
        self._stamp_due = time.monotonic() + index_cache.STAMP_EVERY_S  # (mapping it stamped it)

    @cached_property
    def checksum_value(self) -> str:
        """The manifest checksum of the split (computed once, when first asked for)."""
        value = manifest_checksum(self._checksum_table)
        del self._checksum_table
        return value

    def __len__(self) -> int:
        return len(self.video_id)

    def shard_path(self, i: int) -> Location:
        return join(self.data_dir, self.shards[int(self.shard[i])])

    def frame_offsets(self, i: int) -> np.ndarray:
        """``num_frames + 1`` byte offsets of video ``i``'s frames inside its payload."""
        if self._entry is not None and time.monotonic() >= self._stamp_due:  # every process that reads, hourly
            self._stamp_due = index_cache.keep(self._entry)
        s = self._fo_start[i]
        return self._fo[s : s + self.num_frames[i] + 1]

    def check_shards(self) -> None:
        """Every shard the manifest names exists and is long enough, else ONE error pointing to verify."""
        need = np.zeros(len(self.shards), dtype=np.int64)
        np.maximum.at(need, self.shard, self.offset + self.size)
        count = np.bincount(self.shard, minlength=len(self.shards))
        sizes = self._shard_sizes()
        for s, name in enumerate(self.shards):
            videos = int(count[s])
            if sizes.get(name) is None:
                raise MoquadError(f"shard {name} named by manifests/{self.split}.parquet is missing ({videos} "
                                  f"videos); run `moquad verify {self.data_dir}` and re-run `moquad preprocess`")
            if sizes[name] < need[s]:
                raise MoquadError(f"shard {name} is shorter ({sizes[name]} bytes) than its manifest says "
                                  f"(>= {need[s]}); run `moquad verify {self.data_dir}`")

    def _shard_sizes(self) -> dict[str, int | None]:
        """Size of every shard the manifest names (one listing per folder on a store; http(s) cannot list: a HEAD per
        shard, all at once; a stat per file locally)."""
        if not objstore.is_url(self.data_dir) or str(self.data_dir).startswith("http"):
            return dict(zip(self.shards, objstore.sizes([join(self.data_dir, name) for name in self.shards])))
        listed: dict[str, dict[str, int]] = {}
        out: dict[str, int | None] = {}
        for name in self.shards:
            folder, _, base = name.rpartition("/")
            if folder not in listed:
                listed[folder] = objstore.listdir(join(self.data_dir, folder) if folder else self.data_dir)
            out[name] = listed[folder].get(base)
        return out

    def prefetch(self, *batches: tuple[Sequence[int], Sequence[tuple[int, int]]]) -> None:
        """On an object store, start reading, per batch ``(rows, frames)``, the payloads of ``rows`` and the (video,
        frame) JPEGs ``frames`` in the background, so their latencies overlap with each other and with the caller's
        work (the loader asks for its batch and the next one); the first batch's requests go first, so the next
        one's never delay it. ``payload`` and ``frame_bytes_many`` take them. Reads no batch names are
        dropped, so at most what one call names is held. Local files: nothing."""
        if not objstore.is_url(self.data_dir):
            return  # a local pread is fast: read when used
        wanted = dict.fromkeys(k for rows, frames in batches
                               for k in [*(int(i) for i in rows), *((int(i), int(f)) for i, f in frames)])
        held = self._prefetched  # (objstore lets these finish before a fork: a forked worker inherits results)
        for k in [k for k in held if k not in wanted]:
            held.pop(k).cancel()
        new = [k for k in wanted if k not in held]
        futures = objstore.start(lambda k: self.frame_bytes(*k) if isinstance(k, tuple) else
                                 read_bytes(self.shard_path(k), int(self.offset[k]), int(self.size[k])), new)
        held.update(zip(new, futures))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_prefetched": {}}  # reads in flight stay with the process that started them

    def payload(self, i: int, verify: bool = True) -> bytes:
        """Video ``i``'s concatenated JPEGs: one read (or what ``prefetch`` started), xxh3-checked unless
        ``verify=False``."""
        got = self._prefetched.pop(int(i), None)
        data = got.result() if got is not None else \
            read_bytes(self.shard_path(i), int(self.offset[i]), int(self.size[i]))
        if isinstance(data, Exception):
            raise data
        if verify and xxhash.xxh3_128_hexdigest(data).encode() != self.xxh3[i]:
            raise BadSample("checksum mismatch")
        return data

    def frame_bytes(self, i: int, f: int) -> bytes:
        """The JPEG bytes of frame ``f`` of video ``i`` (one small read; donors and evaluation)."""
        fo = self.frame_offsets(i)
        return read_bytes(self.shard_path(i), int(self.offset[i] + fo[f]), int(fo[f + 1] - fo[f]))

    def frame_bytes_many(self, picks: Sequence[tuple[int, int]]) -> list[bytes | Exception]:
        """``frame_bytes`` of several (video, frame) pairs (RAD donors): on a store concurrently (or what
        ``prefetch`` started), locally in turn; a failed read is returned in its place."""
        def read(p: tuple[int, int]) -> bytes:
            return self.frame_bytes(*p)
        if not objstore.is_url(self.data_dir):
            return [objstore.concurrently(read, [p])[0] for p in picks]
        started = [self._prefetched.pop((int(i), int(f)), None) for i, f in picks]
        rest = iter(objstore.concurrently(read, [p for p, got in zip(picks, started) if got is None]))
        return [got.result() if got is not None else next(rest) for got in started]

    def read_frames(self, i: int, indices: Sequence[int]) -> np.ndarray:
        """Decode frames ``indices`` (any order, repeats allowed) of video ``i`` -> uint8 (T, H, W, 3).

        Reads only the distinct frames' byte ranges (evaluation reads a few clips of long videos); on an object
        store those reads run concurrently, so a video costs about one round trip, not one per frame.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = int(self.num_frames[i])
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"frame index out of range for video {self.video_id[i]} of {n} frames")
        uniq, inverse = np.unique(idx, return_inverse=True)
        data = self.frame_bytes_many([(i, int(f)) for f in uniq])
        for d in data:
            if isinstance(d, Exception):
                raise d
        return np.stack([decode_jpeg(d) for d in data])[inverse]
