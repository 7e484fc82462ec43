"""The frame-index cache (moquad/data/index_cache.py) in the environments clusters have: no home directory, a cache
folder the process cannot enter, a home directory shared over NFS by many nodes (write once, never replace, any load
error a miss, pruning that spares every entry a job reads)."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from video_fixtures import coded_video, write_frames

from moquad.data import index_cache, store
from moquad.errors import MoquadError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-env")
    return write_frames(root, ((f"v{i:02d}", coded_video(i, 3 + i % 5), i % 2) for i in range(12)),
                        classes=["a", "b"], videos_per_shard=5)


@pytest.fixture()
def big(monkeypatch):
    """Every index counts as big: cached (the 4M-frame threshold scaled down to this dataset)."""
    monkeypatch.setattr(index_cache, "INDEX_CACHE_FRAMES", 0)
    monkeypatch.setattr(index_cache, "_said", set(), raising=False)


def _offsets(data: Path) -> list[list[int]]:
    return store.read_manifest(data, "train").column("frame_offsets").to_pylist()


def _no_home(monkeypatch) -> None:
    """A container's user: HOME unset and no passwd entry for the uid (Path.home() raises RuntimeError)."""
    for name in ("HOME", "MOQUAD_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")
    monkeypatch.setattr(pwd, "getpwuid", missing)
    with pytest.raises(RuntimeError, match="Could not determine home directory"):
        Path.home()


def test_a_container_without_a_home_reads_small_and_big_splits(data, monkeypatch, caplog):
    """A small Split never asks for the cache folder; a big one holds its index in memory, one log line says so."""
    _no_home(monkeypatch)
    small = store.Split(data)  # raised RuntimeError: the cache folder was resolved for every Split
    assert [small.frame_offsets(i).tolist() for i in range(len(small))] == _offsets(data)
    monkeypatch.setattr(index_cache, "INDEX_CACHE_FRAMES", 0)
    monkeypatch.setattr(index_cache, "_said", set(), raising=False)
    with caplog.at_level(logging.WARNING, logger="moquad.data.index_cache"):
        first, second = store.Split(data), store.Split(data)
    assert not isinstance(first._fo, np.memmap) and not isinstance(second._fo, np.memmap)
    assert [second.frame_offsets(i).tolist() for i in range(len(second))] == _offsets(data)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "held in memory" in lines[0] and "no home directory" in lines[0], lines


CHILD = """
import sys, numpy as np
from moquad.data import index_cache, store
index_cache.INDEX_CACHE_FRAMES = 0
s = store.Split(sys.argv[1])
print(type(s._fo).__name__, sum(len(s.frame_offsets(i)) for i in range(len(s))))
"""


def _as_plain_user() -> list[str]:
    """A command prefix under which permission bits hold: nothing for a plain user; for root, setpriv without the
    capabilities that override them (root's read and search rights on any folder)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): permission bits cannot be made to hold")
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_a_cache_folder_the_process_cannot_enter_falls_back_to_memory(data, tmp_path):
    """MOQUAD_CACHE under a 0700 folder of another user: the index in memory, ONE warning, exit 0 (it raised
    PermissionError: the ``is_file()`` check sat outside the fallback). Run for real, in a child process, without
    HOME, for which the permission bits hold."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(locked, 54321, 54321)  # another user's folder
    else:
        os.chmod(locked, 0o000)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
    env.update(MOQUAD_CACHE=str(locked / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    try:
        r = subprocess.run([*_as_plain_user(), sys.executable, "-c", CHILD, str(data)], env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(locked, 0o700)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ndarray", str(sum(len(o) for o in _offsets(data)))]
    warned = [x for x in r.stderr.splitlines() if "held in memory" in x]
    assert len(warned) == 1 and "Permission denied" in warned[0], r.stderr
    assert not any(locked.iterdir())


def test_the_cache_folder_is_asked_for_only_by_a_big_index(data, monkeypatch):
    calls = []
    monkeypatch.setattr(index_cache, "index_cache_dir", lambda: calls.append(1) or None)
    store.Split(data)
    assert calls == []
    monkeypatch.setattr(index_cache, "INDEX_CACHE_FRAMES", 0)
    store.Split(data)
    assert calls == [1]


def test_a_cache_entry_written_by_another_node_is_never_replaced(data, tmp_path, monkeypatch, big):
    """Two nodes miss the cache at once: the second's file must not be renamed over the first's (which the first
    node may have memory-mapped: deleting it there is a SIGBUS at its next page-in). The loser maps the winner's."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    real = store._decode_index
    winner = {}

    def decode_while_another_node_writes(file, counts, starts, out):
        index = real(file, counts, starts, out)
        (entry,) = [p for p in [index_cache.index_cache_dir()] if p]  # the other node finishes first
        entry.mkdir(parents=True, exist_ok=True)
        path = entry / f"{key}-uint32.npy"
        np.save(path, index)
        winner["inode"] = path.stat().st_ino
        winner["path"] = path
        return index
    key = store._manifest_file(data, "train")[2]
    monkeypatch.setattr(store, "_decode_index", decode_while_another_node_writes)
    split = store.Split(data)
    assert winner["path"].stat().st_ino == winner["inode"]  # still the other node's file (os.replace made a new one)
    assert isinstance(split._fo, np.memmap) and Path(split._fo.filename) == winner["path"]
    assert sorted(p.name for p in winner["path"].parent.iterdir() if not p.name.endswith(".used")) == \
        [winner["path"].name]  # our temporary file is gone
    assert [split.frame_offsets(i).tolist() for i in range(len(split))] == _offsets(data)


def test_the_temporary_name_holds_host_pid_and_a_random_token(data, tmp_path, monkeypatch, big):
    """``.NAME.tmp.PID`` collided between two nodes whose processes have equal pids (containers)."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    linked = []
    real_link = os.link
    monkeypatch.setattr(index_cache.os, "link", lambda src, dst: linked.append(Path(src).name) or real_link(src, dst))
    store.Split(data)
    shutil.rmtree(tmp_path / "frame-index")
    store.Split(data)
    assert len(linked) == 2 and linked[0] != linked[1]
    host = socket.gethostname()
    assert all(n.startswith(".") and f".{host}.{os.getpid()}." in n and n.endswith(".tmp") for n in linked), linked


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other shape", "folder"])
def test_any_load_error_is_a_cache_miss_and_the_entry_stays(data, tmp_path, monkeypatch, caplog, big, damage):
    """A damaged entry (another writer's crash, another format) is a miss: the index in memory, one log line, the
    file left in place (never replaced: another node may map it)."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    key = store._manifest_file(data, "train")[2]
    path = tmp_path / "frame-index" / f"{key}-uint32.npy"
    path.parent.mkdir()
    frames = sum(len(o) for o in _offsets(data))
    if damage == "garbage":
        path.write_bytes(b"not an npy file at all")
    elif damage == "truncated":
        np.save(path, np.arange(frames, dtype=np.uint32))
        path.write_bytes(path.read_bytes()[:-40])
    elif damage == "other shape":
        np.save(path, np.arange(frames + 1, dtype=np.uint32))
    else:
        path.mkdir()
    before = (path.stat().st_ino, path.stat().st_mtime_ns)
    with caplog.at_level(logging.WARNING, logger="moquad.data.index_cache"):
        split = store.Split(data)
    assert not isinstance(split._fo, np.memmap)
    assert [split.frame_offsets(i).tolist() for i in range(len(split))] == _offsets(data)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == before
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "held in memory" in lines[0] and str(path) in lines[0], lines


def test_old_and_surplus_entries_are_pruned_never_recent_ones(data, tmp_path, monkeypatch, big):
    """The rule, applied by the process that adds an entry: unused for MOQUAD_CACHE_DAYS -> deleted; above
    MOQUAD_CACHE_GB the least recently used go first, but never one used in the last two days; a killed writer's
    temporary file goes after a day; files that are not the cache's are never touched."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setenv("MOQUAD_CACHE_DAYS", "10")
    monkeypatch.setenv("MOQUAD_CACHE_GB", str(3500 / 1e9))  # 3500 bytes
    folder = tmp_path / "frame-index"
    folder.mkdir()
    now, day = time.time(), 86400

    def entry(name: str, age_days: float, size: int = 1000, used_days: float | None = None) -> Path:
        p = folder / name
        p.write_bytes(b"x" * size)
        os.utime(p, (now - age_days * day, now - age_days * day))
        if used_days is not None:
            stamp = p.with_suffix(".used")
            stamp.touch()
            os.utime(stamp, (now - used_days * day, now - used_days * day))
        return p
    h = "0123456789abcdef" * 2
    stale = entry(f"{h[:-1]}1-uint32.npy", 11)  # unused for 11 days
    revived = entry(f"{h[:-1]}2-uint32.npy", 30, used_days=1)  # written long ago, mapped yesterday: kept
    lru = [entry(f"{h[:-1]}{c}-int64.npy", d) for c, d in (("3", 5), ("4", 4), ("5", 3))]  # idle 3-5 days
    fresh = entry(f"{h[:-1]}6-uint32.npy", 0.5)  # used today: never deleted by the size rule
    dead_tmp = entry(f".{h}-uint32.npy.node7.42.ab12.tmp", 2)
    live_tmp = entry(f".{h}-uint32.npy.node8.43.cd34.tmp", 0.01)
    foreign = entry("notes.txt", 400)
    split = store.Split(data)  # adds its entry (~100 bytes) and prunes
    left = {p.name for p in folder.iterdir()}
    assert not {stale.name, dead_tmp.name, stale.with_suffix(".used").name} & left
    assert {revived.name, fresh.name, live_tmp.name, foreign.name, Path(split._fo.filename).name} <= left
    # the size rule: 1000 * (revived, fresh, 3 idle) + entry > 3500 -> the two least recently used idle ones go
    assert [p.name in left for p in lru] == [False, False, True]


def test_a_hit_stamps_its_use_beside_the_entry_not_on_it(data, tmp_path, monkeypatch, big):
    """Touching the entry itself would make every NFS client drop its cached pages of it: the stamp is a file
    beside it, refreshed at most hourly, and a read-only cache (no stamp possible) is still used."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    store.Split(data)
    (entry,) = (tmp_path / "frame-index").glob("*.npy")
    stamp = entry.with_suffix(".used")
    mtime = entry.stat().st_mtime_ns
    old = time.time() - 7200
    os.utime(stamp, (old, old))
    again = store.Split(data)
    assert isinstance(again._fo, np.memmap) and entry.stat().st_mtime_ns == mtime
    assert stamp.stat().st_mtime > old + 3600


def test_an_entry_a_job_reads_is_never_pruned_however_long_the_job(data, tmp_path, monkeypatch, big):
    """A job mapped its entry 3 days ago and has read it since (each epoch reads every video's offsets); another
    process adds an entry with the cache over MOQUAD_CACHE_GB and prunes: the job's entry stays, an idle one goes.
    The stamp was refreshed only when a run mapped the entry: after 2 days the pruner deleted the file the job
    still had mapped (on NFS, a SIGBUS at its next page-in)."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setenv("MOQUAD_CACHE_GB", "0")  # every entry not in use is surplus
    job = store.Split(data)
    entry = Path(job._fo.filename)
    idle = entry.with_name(f"{'0' * 32}-uint32.npy")
    idle.write_bytes(b"x" * 100)
    three_days_ago = time.time() - 3 * 86400
    for p in (entry, entry.with_suffix(".used"), idle):
        os.utime(p, (three_days_ago, three_days_ago))
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + 3 * 86400)  # the job's clock: 3 days on
    assert [job.frame_offsets(i).tolist() for i in range(len(job))] == _offsets(data)  # its latest epoch
    other = write_frames(tmp_path / "other", [("w", coded_video(1, 9), 0)], classes=["a"])
    store.Split(other)  # another job: a new entry, then pruning
    assert entry.is_file() and not idle.exists()
    assert [job.frame_offsets(i).tolist() for i in range(len(job))] == _offsets(data)


@pytest.mark.parametrize("window,kept", [(None, True), ("12", False)], ids=["default 48 h", "12 h"])
def test_the_age_rule_spares_an_entry_in_use_and_the_window_is_configurable(data, tmp_path, monkeypatch, big,
                                                                            window, kept):
    """MOQUAD_CACHE_DAYS of 12 h, an entry last used a day ago: within the default in-use window (48 h) it stays
    (the age rule had no in-use check: deleted), with MOQUAD_CACHE_IN_USE_HOURS=12 it is not in use and goes."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setenv("MOQUAD_CACHE_DAYS", "0.5")
    if window:
        monkeypatch.setenv("MOQUAD_CACHE_IN_USE_HOURS", window)
    folder = tmp_path / "frame-index"
    folder.mkdir()
    used = folder / f"{'0' * 32}-uint32.npy"
    used.write_bytes(b"x" * 100)
    yesterday = time.time() - 86400
    os.utime(used, (yesterday, yesterday))
    store.Split(data)  # adds its entry and prunes
    assert used.is_file() == kept


def test_an_in_use_window_shorter_than_the_stamping_is_one_error(data, tmp_path, monkeypatch, big):
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setenv("MOQUAD_CACHE_IN_USE_HOURS", "1")
    with pytest.raises(MoquadError, match=r"^MOQUAD_CACHE_IN_USE_HOURS=1 is below 3 \(a job stamps its cache entry "
                       r"hourly\); set it to at least 3 or unset it$"):
        store.Split(data)


def test_a_link_whose_nfs_reply_was_lost_counts_as_ours(data, tmp_path, monkeypatch, big):
    """NFS retries a link whose reply was lost and then answers "exists": the temporary file's link count (2) says the
    link was this process's, so it maps its entry (and prunes, as the writer)."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    real_link, pruned = os.link, []

    def link_then_lost_reply(src, dst):
        real_link(src, dst)
        raise FileExistsError(17, "File exists", str(dst))
    monkeypatch.setattr(index_cache.os, "link", link_then_lost_reply)
    monkeypatch.setattr(index_cache, "prune", lambda folder: pruned.append(folder))
    split = store.Split(data)
    assert isinstance(split._fo, np.memmap) and pruned == [tmp_path / "frame-index"]
    assert [p.name for p in (tmp_path / "frame-index").iterdir() if p.suffix == ".tmp"] == []


def test_a_filesystem_without_hard_links_holds_the_index_in_memory(data, tmp_path, monkeypatch, caplog, big):
    """Some FUSE mounts refuse link(2): no entry is written any other way (a rename could replace another node's
    file), the index stays in memory with one log line, and no temporary file is left."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted", str(src))
    monkeypatch.setattr(index_cache.os, "link", no_links)
    with caplog.at_level(logging.WARNING, logger="moquad.data.index_cache"):
        split = store.Split(data)
    assert not isinstance(split._fo, np.memmap)
    assert [split.frame_offsets(i).tolist() for i in range(len(split))] == _offsets(data)
    assert list((tmp_path / "frame-index").iterdir()) == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Operation not permitted" in lines[0], lines


@pytest.mark.parametrize("when", ["after mapping", "before mapping"])
def test_a_prune_between_the_steps_of_a_hit_never_leaves_a_stamp(data, tmp_path, monkeypatch, big, when):
    """A prune by another node runs between a reader's steps on an entry unused for 30 days. After the mapping: the
    reader stamped the entry first, so the prune spares it (mapping then stamping let the prune delete it, and the
    late stamp recreated a ``.used`` file that no prune ever deletes). Before the mapping, with the old stamp read:
    the entry and its stamp go together and the reader writes the entry anew. No stamp is left without its entry."""
    monkeypatch.setenv("MOQUAD_CACHE", str(tmp_path))
    monkeypatch.setenv("MOQUAD_CACHE_DAYS", "1")
    store.Split(data)
    (entry,) = (tmp_path / "frame-index").glob("*.npy")
    month_ago = time.time() - 30 * 86400
    for p in (entry, entry.with_suffix(".used")):
        os.utime(p, (month_ago, month_ago))
    real, calls = index_cache._mapped, []

    def mapped(path):  # the reader's first mapping only
        if calls.append(path) or len(calls) > 1:
            return real(path)
        if when == "before mapping":  # a prune that read the stamp before this reader refreshed it
            index_cache._remove(path)
            return real(path)
        index = real(path)
        index_cache.prune(path.parent)
        return index

    monkeypatch.setattr(index_cache, "_mapped", mapped)
    split = store.Split(data)
    names = sorted(p.name for p in entry.parent.iterdir())
    assert names == [entry.name, entry.with_suffix(".used").name]
    assert time.time() - entry.with_suffix(".used").stat().st_mtime < 600
    assert [split.frame_offsets(i).tolist() for i in range(len(split))] == _offsets(data)


def test_keep_stamps_no_entry_that_is_gone(tmp_path):
    entry = tmp_path / f"{'1' * 32}-uint32.npy"
    index_cache.keep(entry)
    assert list(tmp_path.iterdir()) == []
