"""One writer per output folder (moquad.lock): a second `preprocess` / `pretrain` into the same --out is refused
with one line; a holder that dies (kill -9) leaves no lock behind."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_faults import TINY, moquad, one_line

from moquad.errors import MoquadError
from moquad.lock import hold, lock_name

HOLDER = """
import sys, time
from moquad.lock import hold
with hold(sys.argv[1], sys.argv[2], None if sys.argv[3] == "-" else int(sys.argv[3])):
    print("held", flush=True)
    time.sleep(120)
"""


def holder(folder: Path, command: str, part: int | None = None) -> subprocess.Popen:
    """Another process holding the lock (as a running `moquad COMMAND` does), until killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), command, "-" if part is None else str(part)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_holder_refused_then_free_after_kill9(tmp_path):
    p = holder(tmp_path / "out", "pretrain")
    try:
        with pytest.raises(MoquadError, match=rf"is being written by another `moquad pretrain` \(pid {p.pid} on "
                                              rf"{socket.gethostname()}, since .*\); wait for it to finish"):
            with hold(tmp_path / "out", "pretrain"):
                pass
        with hold(tmp_path / "out", "preprocess", part=0):  # another command's lock: independent
            pass
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert (tmp_path / "out" / lock_name("pretrain")).is_file()  # the file stays, the lock went with the process
    with hold(tmp_path / "out", "pretrain") as path:
        assert path.name == ".moquad-pretrain.lock" and f'"pid": {os.getpid()}' in path.read_text()
    with hold(tmp_path / "out", "pretrain"):  # released on leaving the block
        pass


def test_two_pretrains_into_one_out(tmp_path):
    p = holder(tmp_path / "run", "pretrain")
    try:
        msg = one_line(moquad("pretrain", "--data", tmp_path, "--out", tmp_path / "run", "--epochs", 1, *TINY))
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert msg.startswith(f"error: {tmp_path / 'run'} is being written by another `moquad pretrain` (pid {p.pid}")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_two_preprocess_into_one_out_but_parts_may_run_side_by_side(synth_root, tmp_path):
    out = tmp_path / "shards"
    p = holder(out, "preprocess", part=0)
    try:
        msg = one_line(moquad("preprocess", "ucf101", synth_root, "--out", out, "--short-side", 32, "--workers", 1))
        assert msg.startswith(f"error: {out} is being written by another `moquad preprocess` part 0 (pid {p.pid}")
        assert not (out / "shards").exists()
        other = moquad("preprocess", "ucf101", synth_root, "--out", out, "--short-side", 32, "--workers", 1,
                       "--num-parts", 2, "--part", 1)
        assert other.returncode == 0, other.stderr
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_a_folder_the_lock_created_goes_when_nothing_was_written(tmp_path):
    with pytest.raises(ValueError):
        with hold(tmp_path / "new", "pretrain"):
            raise ValueError("bad settings, found before anything was written")
    assert not (tmp_path / "new").exists()  # a refused run leaves nothing behind
    with hold(tmp_path / "kept", "pretrain"):
        (tmp_path / "kept" / "config.yaml").write_text("x")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".moquad-pretrain.lock", "config.yaml"]


@pytest.mark.parametrize("code, words", [(errno.ENOSYS, "Function not implemented"), (errno.ENOLCK, "No locks")])
def test_a_filesystem_without_flock_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, code, words):
    """Lustre without -o flock (ENOSYS), NFSv3 without statd (ENOLCK): a traceback and a leftover lock folder before."""
    def no_flock(fd, op):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("moquad.lock.fcntl.flock", no_flock)
    for out, existed in ((tmp_path / "new", False), (tmp_path / "old", True)):
        if existed:
            out.mkdir()
            (out / "config.yaml").write_text("x")
        with pytest.raises(MoquadError) as e:
            with hold(out, "pretrain"):
                pytest.fail("the block must not run without the lock")
        assert str(e.value).startswith(f"cannot lock {out}: its filesystem does not support file locks ({words}")
        assert "-o flock" in str(e.value)
        assert (sorted(p.name for p in out.iterdir()) == ["config.yaml"]) if existed else not out.exists()
