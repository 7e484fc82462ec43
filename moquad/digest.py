"""The sha256 of a file: the identity of a checkpoint, an export or a video in every result.

Read once per file version: a command asks for it from extraction (each split) and the result's provenance, so the
digest is kept, keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """sha256 hex digest of a file, e.g. ``sha256_file("runs/moquad/checkpoints/last.pt")``."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
