"""One writer per output folder: ``moquad preprocess`` (per part) and ``moquad pretrain`` lock their ``--out``.

The lock is ``fcntl.flock`` on a small file in the folder (``.moquad-pretrain.lock``,
``.moquad-preprocess-000.lock``). The kernel releases it when the holder dies however it dies
(``kill -9``, out of memory, a crash), so a crashed run never blocks the next one; the file itself stays
and names its last holder (pid, host, command, start time) for the refusal message. A second writer is
refused with one line at once, it never waits. On NFS v4 and Lustre ``flock`` works across hosts.
Object-store outputs (``s3://...``) are not locked.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from moquad.errors import MoquadError, disk_errors

F = TypeVar("F", bound=Callable[..., Any])


def lock_name(command: str, part: int | None = None) -> str:
    """File name of the lock of ``command`` (one per part for preprocessing: parts may run side by side)."""
    return f".moquad-{command}.lock" if part is None else f".moquad-{command}-{part:03d}.lock"


def _holder(path: Path) -> str:
    """Who holds ``path``, as written by the holder (it may not have written it yet)."""
    try:
        who = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["since"]))
        return f"pid {who['pid']} on {who['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def hold(folder: str | Path, command: str, part: int | None = None) -> Iterator[Path]:
    """Hold the writer lock of ``folder`` for ``moquad COMMAND`` (refuse with a MoquadError if it is held)."""
    folder = Path(folder).expanduser()
    path = folder / lock_name(command, part)
    created, new_file = not folder.exists(), not path.exists()
    with disk_errors(path):
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            what = f"`moquad {command}`" + (f" part {part}" if part is not None else "")
            raise MoquadError(f"{folder} is being written by another {what} ({_holder(path)}); wait for it to "
                              "finish or choose another output folder") from None
        except OSError as e:  # ENOSYS: Lustre without -o flock; ENOLCK: NFSv3 without its lock daemon (statd)
            if created:
                _tidy(folder, path)
            elif new_file:
                path.unlink(missing_ok=True)
            raise MoquadError(f"cannot lock {folder}: its filesystem does not support file locks ({e.strerror or e}); "
                              "mount it with locking (Lustre: -o flock; NFSv3: run rpc.statd) or choose an output folder "
                              "on a filesystem that has them") from None
        held = True
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        if held and created:
            _tidy(folder, path)
        os.close(fd)  # releases the lock


def _tidy(folder: Path, path: Path) -> None:
    """Remove the folder the lock created if nothing but the lock file went into it (a run that failed at once)."""
    if [p.name for p in folder.iterdir()] == [path.name]:
        path.unlink(missing_ok=True)
        folder.rmdir()


def exclusive(command: str) -> Callable[[F], F]:
    """Decorate ``fn(cfg, ...)`` to hold the lock of ``cfg.out`` (of ``cfg.part`` when it has parts) while it runs."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def locked(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            out = str(getattr(cfg, "out", "") or "")
            if not out or "://" in out:  # no folder (fn reports it) or an object store
                return fn(cfg, *args, **kwargs)
            with hold(out, command, getattr(cfg, "part", None)):
                return fn(cfg, *args, **kwargs)

        return locked  # type: ignore[return-value]

    return wrap
