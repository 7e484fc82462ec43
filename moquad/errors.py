"""The error policy, in one place.

Expected failures -- bad input, bad config, a refused or broken checkpoint, a full or read-only
disk -- reach the user as ONE ``error:`` line that says what to do, and exit code 2
(``moquad.cli`` prints them; ``moquad --debug`` or ``MOQUAD_DEBUG=1`` adds the traceback). They
are raised as :class:`MoquadError`, ``ValueError``, ``FileNotFoundError``, ``NotADirectoryError``
or ``FileExistsError`` (the library's historic user errors), or are an ``OSError`` from the
filesystem whose errno is in :data:`DISK_ERRNOS` (worded by :func:`disk_error`).
:func:`user_message` decides. Anything else is a bug and keeps its traceback.

A message that says which setting to change names it as its reader sets it (:func:`setting`): a command's flag
(``--batch-size 8``, or ``--set KEY=VALUE`` for a setting without one) while the command line runs a command
(:func:`command_flags`), the config field (``batch_size=8``) when moquad is called from Python.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


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


# the historic user-error types of the library: their message is already the one line to show
USER_ERRORS = (MoquadError, ValueError, FileNotFoundError, NotADirectoryError, FileExistsError)


def user_message(e: BaseException) -> str | None:
    """The one line to show for an expected failure, or None for a bug (which keeps its traceback)."""
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        if e.errno in (errno.EACCES, errno.EPERM):  # reading or writing: say which file, not which way
            return f"permission denied: {e.filename or e}; check its permissions or choose another folder"
        if e.filename:
            return str(disk_error(e, e.filename))
        return f"{e.strerror or e}; free space or choose another folder, then re-run the same command"
    if isinstance(e, USER_ERRORS):
        text = str(e).strip()
        if text.startswith("Caught ") and "Original Traceback" in text:  # re-raised by a DataLoader from a worker
            return text.splitlines()[-1].split(": ", 1)[-1]  # the worker's own last line, without its type
        return text.splitlines()[0] if text else type(e).__name__
    return None


@contextmanager
def disk_errors(path: str | Path, resume_hint: str = "re-run the same command to resume") -> Iterator[None]:
    """Turn a full, read-only or forbidden disk while writing ``path`` into the one-line :func:`disk_error`."""
    try:
        yield
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            raise disk_error(e, path, resume_hint) from e
        raise


# The flags of the command that is running (setting -> its flag: "epochs" -> "--epochs"), set by the command line
# around a command's work; None: moquad is called from Python, where a setting is a config field or a keyword.
# A plain module value, not a ContextVar: the loader's worker processes (forked) word their messages alike.
_COMMAND_FLAGS: Mapping[str, str] | None = None


@contextmanager
def command_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """Within: messages name settings the way the running command takes them (:func:`setting`)."""
    global _COMMAND_FLAGS
    before, _COMMAND_FLAGS = _COMMAND_FLAGS, dict(flags)
    try:
        yield
    finally:
        _COMMAND_FLAGS = before


def setting(key: str, value: Any) -> str:
    """How a message tells its reader to set ``key`` (dotted for nested ones) to ``value``: from the command line
    the command's own flag (``--batch-size 8``, ``--no-sync-bn``) or ``--set loader.appearance_op=rad_intra``; from
    Python the config field (``batch_size=8``, ``loader.appearance_op='rad_intra'``)."""
    if _COMMAND_FLAGS is None:
        return f"{key}={value!r}"
    flag = _COMMAND_FLAGS.get(key)
    text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    if flag is None:
        return f"--set {key}={text.lower() if isinstance(value, bool) else text}"
    if isinstance(value, bool):  # "--sync-bn/--no-sync-bn": the switch that gives it
        on, _, off = flag.partition("/")
        return on if value else off or f"--set {key}=false"
    return f"{flag} {text}"
