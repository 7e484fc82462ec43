"""The one reader of the on-disk format: ``dataset.json``, the manifests, a sample's bytes and frames.

Written by ``moquad preprocess`` (schema in ``manifests/SCHEMA.md``); read here by the loader,
feature extraction, the linear probe, fine-tuning, ``cam``, ``info`` and ``verify``.

A :class:`Split` holds one split's manifest as flat numpy arrays (cheap to send to DataLoader
workers) and reads by offset: a sample is ONE read of ``(shard, jpgs_offset, jpgs_size)``
(:func:`read_bytes`, the single place that touches sample bytes: a ``pread`` locally, ONE ranged GET
on an object store, see :mod:`moquad.objstore`), checked against its xxh3; a frame is one read of its
byte range. ``data_dir`` is a folder or a URL (``s3://bucket/prefix``, ``gs://``, ``http(s)://``). The manifest is the dataset: files it
does not name are never opened, and a shard it names that is missing or too short is an error at
start-up (:meth:`Split.check_shards`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import simplejpeg
import xxhash

from moquad import objstore
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


def _parquet(path: Location) -> pa.Table:
    return pq.read_table(pa.BufferReader(_read(path, "the manifests")))


def read_manifest(data_dir: Location, split: str) -> pa.Table:
    """The merged manifest of ``split`` (one row per video)."""
    path = join(data_dir, "manifests", f"{split}.parquet")
    try:
        table = _parquet(path)
    except FileNotFoundError:
        have = sorted(n[: -len(".parquet")] for n in objstore.listdir(join(data_dir, "manifests"))
                      if n.endswith(".parquet") and n != "errors.parquet")
        raise FileNotFoundError(f"no manifest for split {split!r} in {data_dir}; "
                                f"available: {', '.join(have) or 'none'}") from None
    missing = [c for c in MANIFEST_SCHEMA.names if c not in table.column_names]
    if missing:
        raise MoquadError(f"{path} lacks the columns {', '.join(missing)}; re-run `moquad preprocess` with this version")
    return table.select(MANIFEST_SCHEMA.names).cast(MANIFEST_SCHEMA)


def read_errors(data_dir: Location) -> pa.Table:
    """``manifests/errors.parquet`` (inputs that were not written, with the reason); empty when absent."""
    try:
        return _parquet(join(data_dir, "manifests", "errors.parquet")).cast(ERRORS_SCHEMA)
    except FileNotFoundError:
        return ERRORS_SCHEMA.empty_table()


def manifest_checksum(table: pa.Table) -> str:
    """sha256 over the rows' (video_id, label, class_name, payload checksum, num_frames).

    Identifies the data content independently of how the Parquet file was written or where the
    shards live, so a re-merged manifest of the same videos keeps caches valid.
    """
    h = hashlib.sha256()
    cols = [table.column(c).to_pylist() for c in ("video_id", "label", "class_name", "checksum", "num_frames")]
    for row in zip(*cols):
        h.update(json.dumps(row).encode())
        h.update(b"\n")
    return h.hexdigest()


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


def decode_jpeg(data: bytes | memoryview, out: np.ndarray | None = None) -> np.ndarray:
    """One JPEG -> uint8 (H, W, 3) RGB (into ``out`` when given); a broken JPEG raises BadSample."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out) if out is not None else \
            simplejpeg.decode_jpeg(data, colorspace="RGB")
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


class Split:
    """One split's manifest as numpy arrays, with readers of its samples by offset."""

    def __init__(self, data_dir: Location, split: str = "train") -> None:
        table = read_manifest(data_dir, split)
        self.data_dir, self.split = data_dir if objstore.is_url(data_dir) else Path(data_dir), split
        self._prefetched: dict[int | tuple[int, int], Future] = {}  # reads in flight (stores; prefetch)
        self.video_id = np.asarray(table.column("video_id").to_pylist(), dtype=object)
        self.label = table.column("label").to_numpy().astype(np.int64)
        self.class_name = table.column("class_name").to_pylist()
        shard_names = table.column("shard").to_pylist()
        self.shards = sorted(set(shard_names))
        where = {s: i for i, s in enumerate(self.shards)}
        self.shard = np.asarray([where[s] for s in shard_names], dtype=np.int64)
        self.offset = table.column("jpgs_offset").to_numpy().astype(np.int64)
        self.size = table.column("jpgs_size").to_numpy().astype(np.int64)
        self.num_frames = table.column("num_frames").to_numpy().astype(np.int64)
        self.height = table.column("height").to_numpy().astype(np.int64)
        self.width = table.column("width").to_numpy().astype(np.int64)
        fo = table.column("frame_offsets").combine_chunks()
        self._fo = fo.flatten().to_numpy().astype(np.int64)
        self._fo_start = np.asarray(fo.offsets.to_numpy()[:-1], dtype=np.int64) - int(fo.offsets[0].as_py())
        self.checksum = table.column("checksum").to_pylist()
        self.xxh3 = table.column("xxh3").to_pylist()
        self.checksum_value = manifest_checksum(table)

    def __len__(self) -> int:
        return len(self.video_id)

    def shard_path(self, i: int) -> Location:
        return join(self.data_dir, self.shards[int(self.shard[i])])

    def frame_offsets(self, i: int) -> np.ndarray:
        """``num_frames + 1`` byte offsets of video ``i``'s frames inside its payload."""
        s = self._fo_start[i]
        return self._fo[s : s + self.num_frames[i] + 1]

    def check_shards(self) -> None:
        """Every shard the manifest names exists and is long enough, else ONE error pointing to verify."""
        need = np.zeros(len(self.shards), dtype=np.int64)
        np.maximum.at(need, self.shard, self.offset + self.size)
        sizes = self._shard_sizes()
        for s, name in enumerate(self.shards):
            videos = int((self.shard == s).sum())
            if sizes.get(name) is None:
                raise MoquadError(f"shard {name} named by manifests/{self.split}.parquet is missing ({videos} "
                                  f"videos); run `moquad verify {self.data_dir}` and re-run `moquad preprocess`")
            if sizes[name] < need[s]:
                raise MoquadError(f"shard {name} is shorter ({sizes[name]} bytes) than its manifest says "
                                  f"(>= {need[s]}); run `moquad verify {self.data_dir}`")

    def _shard_sizes(self) -> dict[str, int | None]:
        """Size of every shard the manifest names (one listing per folder on a store, a stat per file locally)."""
        if not objstore.is_url(self.data_dir) or str(self.data_dir).startswith("http"):
            return {name: objstore.size(join(self.data_dir, name)) for name in self.shards}
        listed: dict[str, dict[str, int]] = {}
        out: dict[str, int | None] = {}
        for name in self.shards:
            folder, _, base = name.rpartition("/")
            if folder not in listed:
                listed[folder] = objstore.listdir(join(self.data_dir, folder) if folder else self.data_dir)
            out[name] = listed[folder].get(base)
        return out

    def prefetch(self, rows: Sequence[int], frames: Sequence[tuple[int, int]] = ()) -> None:
        """On an object store, start reading the payloads of ``rows`` and the (video, frame) JPEGs ``frames`` in
        the background, so their latencies overlap with each other and with the caller's work (the loader asks for
        its batch and the next one); :meth:`payload` and :meth:`frame_bytes_many` take them. Reads asked for in
        neither argument are dropped, so at most what one call names is held. Local files: nothing."""
        if not objstore.is_url(self.data_dir):
            return  # a local pread is fast: read when used
        wanted = dict.fromkeys([*(int(i) for i in rows), *((int(i), int(f)) for i, f in frames)])
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
        """Video ``i``'s concatenated JPEGs: one read (or what :meth:`prefetch` started), xxh3-checked unless
        ``verify=False``."""
        got = self._prefetched.pop(int(i), None)
        data = got.result() if got is not None else \
            read_bytes(self.shard_path(i), int(self.offset[i]), int(self.size[i]))
        if isinstance(data, Exception):
            raise data
        if verify and xxhash.xxh3_128_hexdigest(data) != self.xxh3[i]:
            raise BadSample("checksum mismatch")
        return data

    def frame_bytes(self, i: int, f: int) -> bytes:
        """The JPEG bytes of frame ``f`` of video ``i`` (one small read; donors and evaluation)."""
        fo = self.frame_offsets(i)
        return read_bytes(self.shard_path(i), int(self.offset[i] + fo[f]), int(fo[f + 1] - fo[f]))

    def frame_bytes_many(self, picks: Sequence[tuple[int, int]]) -> list[bytes | Exception]:
        """:meth:`frame_bytes` of several (video, frame) pairs (RAD donors): on a store concurrently (or what
        :meth:`prefetch` started), locally in turn; a failed read is returned in its place."""
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
