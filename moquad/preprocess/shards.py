"""Atomic webdataset shard writer: one tar sample per video (``{key}.json`` + ``{key}.jpgs``).

A shard is written to ``{name}.tmp`` and renamed to its final ``.tar`` name only when complete
(``os.replace`` after fsync), then its manifest rows are recorded in ``manifests/_parts/`` (also
atomically). The record is the commit point: a ``.tar`` without a record (a crash between the
two renames) is deleted on resume and its videos are redone, so no half shard is ever visible
under a final name and no video is written twice.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moquad.errors import disk_errors
from moquad.preprocess import manifest
from moquad.preprocess.manifest import sample_key


def shard_name(split: str, part: int, index: int) -> str:
    return f"{split}-{part:03d}-{index:06d}.tar"


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class ShardWriter:
    """Append samples of one split/part; roll to a new shard past ``max_bytes``; commit atomically."""

    def __init__(self, data_dir: str | Path, split: str, part: int, start_index: int, max_bytes: int):
        self.data_dir = Path(data_dir)
        self.split, self.part, self.index, self.max_bytes = split, part, start_index, max_bytes
        (self.data_dir / "shards").mkdir(parents=True, exist_ok=True)
        self._tar: tarfile.TarFile | None = None
        self._fh: io.BufferedWriter | None = None
        self._rows: list[dict[str, Any]] = []
        self.committed: list[str] = []  # relative shard paths written by this writer
        # called with (shard path, rows) after the tar is renamed and before its record (an upload)
        self.before_record: Callable[[str, list[dict[str, Any]]], None] | None = None

    @property
    def rel_path(self) -> str:
        return f"shards/{shard_name(self.split, self.part, self.index)}"

    @property
    def _tmp(self) -> Path:
        return self.data_dir / (self.rel_path + ".tmp")

    def _open(self) -> None:
        with disk_errors(self.data_dir / self.rel_path):
            self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in commit()
        self._tar = tarfile.open(fileobj=self._fh, mode="w", format=tarfile.PAX_FORMAT)
        self._rows = []

    def add(self, row: dict[str, Any], jpgs: bytes) -> dict[str, Any]:
        """Write one video; ``row`` is its manifest row without shard/offset/jpgs_offset.

        Returns the completed row (it is recorded when the shard commits).
        """
        if self._tar is not None and self._tar.offset > 0 and self._tar.offset + len(jpgs) + 4096 > self.max_bytes:
            self.commit()
        if self._tar is None:
            self._open()
        assert self._tar is not None  # internal invariant, not user data
        key = sample_key(row["video_id"])
        meta = json.dumps(row, ensure_ascii=False, sort_keys=True).encode("utf-8")
        tar = self._tar
        offset = tar.offset
        with disk_errors(self.data_dir / self.rel_path):
            info = _tarinfo(f"{key}.json", len(meta))
            tar.addfile(info, io.BytesIO(meta))
            info = _tarinfo(f"{key}.jpgs", len(jpgs))
            jpgs_offset = tar.offset + len(info.tobuf(tar.format, tar.encoding, tar.errors))
            tar.addfile(info, io.BytesIO(jpgs))
        full = {**row, "shard": self.rel_path, "offset": offset, "jpgs_offset": jpgs_offset}
        self._rows.append(full)
        return full

    def commit(self) -> None:
        """Finish the open shard: close, fsync, rename to ``.tar``, then record its rows."""
        if self._tar is None or self._fh is None:
            return
        final = self.data_dir / self.rel_path
        with disk_errors(self.data_dir / self.rel_path):
            self._tar.close()
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.replace(self._tmp, final)
        try:
            if self.before_record is not None:
                self.before_record(self.rel_path, self._rows)
            manifest.write_record(self.data_dir, self.split, self.part, self.index, self._rows)
        except BaseException:
            final.unlink(missing_ok=True)  # not recorded = not committed; its videos are redone
            raise
        self.committed.append(self.rel_path)
        self._tar, self._fh, self._rows = None, None, []
        self.index += 1

    def abort(self) -> None:
        """Drop the open shard (its videos were never recorded, so a re-run redoes them)."""
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass  # a full disk refuses the last flush; the file is deleted anyway
            self._tmp.unlink(missing_ok=True)
        self._tar, self._fh, self._rows = None, None, []
