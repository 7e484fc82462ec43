"""The node-wide frame-index cache: a big split's frame index decoded once into a file that every process of a node
(and the next run) memory-maps instead of decoding it again (1M videos: ~8 s and 1 GB per rank).

The folder may be a home directory shared over NFS by many nodes, so an entry is written once and never replaced
or deleted while a job uses it: deleting a file another node has mapped is a SIGBUS there at its next page-in. A
process that reads from an entry stamps its use beside it (:func:`keep`), and pruning spares every entry stamped
within the in-use window (``$MOQUAD_CACHE_IN_USE_HOURS``). The rules are in ``docs/guides/environments.md``. The format
itself (decoding the manifest's ``frame_offsets``) is :mod:`moquad.data.store`'s.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moquad.errors import MoquadError

log = logging.getLogger("moquad.data.index_cache")
# frame indexes of at least this many frames are kept as files, memory-mapped by every process of the node
INDEX_CACHE_FRAMES = 1 << 22
CACHE_DAYS = 14.0  # pruning: an entry unused this long is deleted ($MOQUAD_CACHE_DAYS) ...
CACHE_GB = 50.0  # ... and above this total, least recently used entries go first ($MOQUAD_CACHE_GB) ...
IN_USE_HOURS = 48.0  # ... but never one used this recently: a running job may map it ($MOQUAD_CACHE_IN_USE_HOURS)
STAMP_EVERY_S = 3600.0  # a process reading an entry stamps its use at most this often (so a stamp is < 2 h old)
_ENTRY = re.compile(r"^[0-9a-f]{32}-(uint32|int64)\.npy$")
_TEMP = re.compile(r"^\.[0-9a-f]{32}-.*\.tmp$")
_said: set[str] = set()  # the reasons already logged by this process


def index_cache_dir() -> Path | None:
    """Where frame indexes are cached: ``$MOQUAD_CACHE/frame-index``, by default under ``$XDG_CACHE_HOME/moquad`` or
    ``~/.cache/moquad``; None without MOQUAD_CACHE and a home directory (a container's user without a passwd entry).
    Asked only when a big index is to be cached (:data:`INDEX_CACHE_FRAMES`), never for a small split."""
    root = os.environ.get("MOQUAD_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        try:
            root = Path(xdg) / "moquad" if xdg else Path.home() / ".cache" / "moquad"
        except (RuntimeError, KeyError, OSError):  # Path.home(): "Could not determine home directory"
            return None
    return Path(root) / "frame-index"


def cached_index(key: str, total: int, dtype: type, decode: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The frame index ``KEY-DTYPE.npy`` of the cache, memory-mapped; on a miss ``decode`` fills a new array that is
    written once into the cache (then this process prunes it) and mapped. Where there is no cache folder or it
    cannot be used, the decoded index stays in memory (one log line says so, nothing is raised)."""
    folder = index_cache_dir()
    if folder is None:
        return _in_memory(decode(np.empty(total, dtype=dtype)), "no MOQUAD_CACHE and no home directory")
    path = folder / f"{key}-{np.dtype(dtype).name}.npy"
    cached = _load_cached(path, total, dtype)
    if isinstance(cached, np.ndarray):
        return cached
    index = decode(np.empty(total, dtype=dtype))
    if cached is not None:  # an entry in place that cannot be used: never replaced (another node may map it)
        return _in_memory(index, cached)
    try:
        wrote = _write_once(path, index)
    except OSError as e:  # a folder that cannot be entered or written, a full disk, no hard links
        return _in_memory(index, f"cannot write {folder}: {e.strerror or e}")
    mapped = _load_cached(path, total, dtype)
    if wrote:
        prune(folder)
    if isinstance(mapped, np.ndarray):
        return mapped
    return _in_memory(index, mapped or f"{path} vanished once written")


def entry_of(index: np.ndarray) -> Path | None:
    """The cache entry ``index`` maps (None for an index held in memory)."""
    return Path(index.filename) if isinstance(index, np.memmap) and index.filename else None


def keep(entry: Path) -> float:
    """Stamp ``entry`` as used now, unless any process did in the last :data:`STAMP_EVERY_S`; the monotonic time at
    which a reader should call again. A reader that calls it as it reads keeps its entry out of pruning. An entry
    that is gone gets no stamp, nor one that a prune deleted while it was made (no stamp outlives its entry)."""
    stamp = entry.with_suffix(".used")  # a file beside it: touching the entry itself would make every NFS client
    try:  # drop its cached pages of the entry
        if time.time() - stamp.stat().st_mtime > STAMP_EVERY_S:
            os.utime(stamp)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if entry.exists():
                stamp.touch()
                if not entry.exists():  # pruned in between: its stamp goes with it
                    stamp.unlink()
    except OSError:
        pass  # a read-only cache (filled by an administrator): used, not stamped
    return time.monotonic() + STAMP_EVERY_S


def _in_memory(index: np.ndarray, reason: str) -> np.ndarray:
    """``index`` as it is (this process's own copy), with ONE log line per process and reason saying why."""
    if reason not in _said:
        _said.add(reason)
        log.warning("frame index held in memory, not in the shared cache (%s); set MOQUAD_CACHE to a writable "
                    "folder so the processes of a node share one copy", reason)
    return index


def _load_cached(path: Path, total: int, dtype: type) -> np.ndarray | str | None:
    """The cache entry at ``path`` memory-mapped, its use stamped FIRST (:func:`keep`: a prune from then on spares
    it) and its presence checked again once mapped (a prune that read the old stamp may have deleted it between);
    None when there is none; else why it cannot be used (unreadable, damaged, another shape). Any load error is a
    cache miss."""
    keep(path)
    try:
        index = _mapped(path)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a cache: whatever fails to load is a miss, never the run's failure
        return f"cannot use {path}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
    if not path.exists():  # deleted once mapped: a miss, and no stamp left for it
        with contextlib.suppress(OSError):
            path.with_suffix(".used").unlink()
        return None
    if index.shape != (total,) or index.dtype != dtype:
        return f"cannot use {path}: {index.dtype}{list(index.shape)}, expected {np.dtype(dtype)}[{total}]"
    return index


def _write_once(path: Path, index: np.ndarray) -> bool:
    """Write ``index`` to ``path`` unless a file is there: True when this process created it.

    Safe on a home directory shared over NFS: the bytes go to a temporary file named for this host, process and a
    random token (equal pids on two nodes never collide), are fsynced, then hard-linked to ``path``, which fails
    when another process got there first: a file in place is never replaced (replacing one that another node has
    memory-mapped deletes it there: SIGBUS at its next page-in). A link whose reply NFS lost and retried says
    "exists": the temporary file's link count tells whether it was ours."""
    path.parent.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())
    tmp = path.with_name(f".{path.name}.{host}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    try:
        with open(tmp, "xb") as f:
            np.save(f, index)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return os.stat(tmp).st_nlink > 1
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def prune(folder: Path) -> None:
    """The cache's pruning rule, applied by a process that has just added an entry (so once per new index).

    No entry used within ``$MOQUAD_CACHE_IN_USE_HOURS`` (48) is ever deleted: a job may have it mapped. Others go
    when not used for ``$MOQUAD_CACHE_DAYS`` (14) days, then, while the entries hold more than ``$MOQUAD_CACHE_GB``
    (50) GB, least recently used first. "Used": the time of its ``.used`` stamp, refreshed by every process that
    reads it (:func:`keep`, at most hourly), else of its creation. Temporary files a killed writer left are deleted
    after a day. Only this cache's own file names are ever deleted."""
    now, days, limit = time.time(), _env_number("MOQUAD_CACHE_DAYS", CACHE_DAYS), _env_number("MOQUAD_CACHE_GB", CACHE_GB)
    in_use = in_use_window_s()
    entries = []
    for p in (p for p in _listing(folder) if _ENTRY.match(p.name) or _TEMP.match(p.name)):
        with contextlib.suppress(OSError):
            st = p.stat()
            used = st.st_mtime
            with contextlib.suppress(OSError):
                used = max(used, p.with_suffix(".used").stat().st_mtime)
            if now - used > (86400 if p.name.endswith(".tmp") else max(days * 86400, in_use)):
                _remove(p)
            elif p.suffix == ".npy":
                entries.append((used, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for used, size, p in sorted(entries):  # least recently used first
        if total <= limit * 1e9 or now - used < in_use:
            break
        _remove(p)
        total -= size


def in_use_window_s() -> float:
    """``$MOQUAD_CACHE_IN_USE_HOURS`` (48) in seconds: an entry stamped this recently is never deleted. At least 3 h,
    since a reader's stamp can be up to 2 h old (:data:`STAMP_EVERY_S`)."""
    hours = _env_number("MOQUAD_CACHE_IN_USE_HOURS", IN_USE_HOURS)
    if hours * 3600 < 3 * STAMP_EVERY_S:
        raise MoquadError(f"MOQUAD_CACHE_IN_USE_HOURS={hours:g} is below 3 (a job stamps its cache entry hourly); "
                          "set it to at least 3 or unset it")
    return hours * 3600


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _remove(entry: Path) -> None:
    for p in (entry, entry.with_suffix(".used")):
        with contextlib.suppress(OSError):
            p.unlink()


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    try:
        return float(value) if value else default
    except ValueError:
        raise MoquadError(f"{name}={value!r} is not a number; set it to a number or unset it") from None


def _mapped(path: Path) -> np.ndarray:
    """A cached index, memory-mapped read-only and advised random: lookups jump across the file, and a cold page
    cache would otherwise read ahead megabytes around each one."""
    index = np.load(path, mmap_mode="r")
    if hasattr(mmap, "MADV_RANDOM") and isinstance(getattr(index, "_mmap", None), mmap.mmap):
        index._mmap.madvise(mmap.MADV_RANDOM)
    return index
