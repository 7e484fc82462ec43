"""THE atomic write: a file appears complete under its final name, or not at all.

Every output moquad writes (checkpoints, manifests, dataset.json, results, exported weights) goes
through :func:`atomic_write`: the bytes go to a hidden temp file beside the target (``.NAME.tmp.PID``),
are fsynced, and replace the target with ``os.replace``; on any failure the temp file is removed, and a
full or read-only disk becomes the one-line ``moquad.errors.disk_error`` message.
:func:`remove_stale_temps` clears temp files that a killed process (``kill -9``) left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from moquad.errors import disk_errors


def temp_path(path: Path) -> Path:
    """The temp file :func:`atomic_write` uses for ``path`` in this process."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None],
                 resume_hint: str = "re-run the same command to resume") -> Path:
    """Call ``write(f)`` on a temp file, fsync it and rename it to ``path``."""
    path = Path(path)
    tmp = temp_path(path)
    with disk_errors(path, resume_hint):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # e.g. a read-only disk: nothing was written there either
            raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Delete ``.NAME.tmp.PID`` files in ``folder`` that a killed or failed writer left (not a live process's).

    Only the main process (torchrun ``RANK`` 0, the one that writes) deletes anything.
    """
    folder = Path(folder)
    if not folder.is_dir() or os.environ.get("RANK", "0") != "0":
        return []
    removed = []
    for tmp in folder.glob(".*.tmp.*"):
        pid = tmp.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
