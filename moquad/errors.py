"""The error policy, in one place.

Expected failures -- bad input, bad config, a refused or broken checkpoint, a full or read-only
disk -- reach the user as ONE ``error:`` line that says what to do, and exit code 2
(``moquad.cli`` prints them). They are raised as :class:`MoquadError`, ``ValueError`` or
``FileNotFoundError`` (the library's historic user errors), or an ``OSError`` from the filesystem
turned into a message by :func:`disk_error`. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


class MoquadError(Exception):
    """An expected failure; the message says what happened and what to do."""


# OSErrors that are the environment's fault, not a bug: reported in one line
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def free_mb(path: str | Path) -> float:
    """Free space (MB) on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free / 1e6
    except OSError:
        return float("nan")


def disk_error(e: OSError, path: str | Path, resume_hint: str = "re-run the same command to resume") -> MoquadError:
    """A one-line :class:`MoquadError` for an ``OSError`` raised while writing ``path``.

    ``raise disk_error(e, path) from e`` where a write can fail for lack of space or permission.
    """
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return MoquadError(f"no space left on device while writing {path} ({free_mb(path):.0f} MB free); "
                           f"free space and {resume_hint}")
    if e.errno == errno.EROFS:
        return MoquadError(f"read-only file system: cannot write {path}; choose a writable output folder")
    if e.errno in (errno.EACCES, errno.EPERM):
        return MoquadError(f"permission denied writing {path}; choose a folder you can write to")
    return MoquadError(f"cannot write {path}: {e.strerror or e}")
