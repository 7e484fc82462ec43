"""Every run ENDS: a failure with loader workers (which ignore SIGTERM) or in one of two ranks ends every process
within 30 s with a non-zero code and the error (moquad.data.workers.end_workers); the SLURM script requeues on
rank 0's preemption marker, whatever code srun returns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from s3server import free_port
from video_fixtures import coded_dataset

from moquad.data import workers

REPO = Path(__file__).resolve().parent.parent
LIMIT = 30.0  # seconds from the failure to the end of every process

# Raise in the step ``AT`` (1-based) of rank ``RANK``; write the time of the failure for the test to measure from.
FAIL_AT_STEP = """
import os, sys, time
import moquad.train.loop as L
real, calls = L.forward_loss, []
def forward_loss(*a, **k):
    calls.append(1)
    if len(calls) == {at} and os.environ.get("RANK", "0") == "{rank}":
        open({stamp!r}, "w").write(repr(time.time()))
        raise RuntimeError("injected failure at step {at}")
    return real(*a, **k)
L.forward_loss = forward_loss
from moquad.cli import main
sys.argv[0] = "moquad"
main()
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return coded_dataset(tmp_path_factory.mktemp("endings") / "data", num_videos=16, num_frames=24, videos_per_shard=4)


def pretrain_args(data: Path, out: Path, workers_: int) -> list[str]:
    return ["pretrain", "--data", str(data), "--out", str(out), "--backbone", "tiny", "--batch-size", "4",
            "--frames", "4", "--size", "32", "--workers", str(workers_), "--device", "cpu", "--warmup-ratio", "0",
            "--epochs", "3"]


def start(code: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**base, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], stamp: Path) -> tuple[list[int], list[str], float]:
    """Wait for every process (killing them after 300 s); the codes, stderr and the seconds from failure to end."""
    deadline = time.time() + 300
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.time()))[1])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a process was still running 300 s after the start (pid {p.pid}): the run hangs")
    ended = time.time()
    assert stamp.is_file(), f"the failure was never injected: {outs}"
    return [p.returncode for p in procs], outs, ended - float(stamp.read_text())


def test_a_crash_with_loader_workers_ends_the_run(data, tmp_path):
    """The issue's reproduction: --workers 2 and an exception at step 3 hung forever in multiprocessing's exit."""
    stamp = tmp_path / "failed_at"
    code = FAIL_AT_STEP.format(at=3, rank=0, stamp=str(stamp))
    (rc,), (err,), seconds = finish([start(code, pretrain_args(data, tmp_path / "run", 2), {})], stamp)
    assert rc == 1 and "RuntimeError: injected failure at step 3" in err  # a bug keeps its traceback
    assert seconds < LIMIT


def test_two_ranks_end_when_rank_0_fails_mid_epoch(data, tmp_path):
    """Started as srun starts them (RANK, WORLD_SIZE, MASTER_*), loader workers on: rank 1 ends too."""
    stamp = tmp_path / "failed_at"
    code = FAIL_AT_STEP.format(at=3, rank=0, stamp=str(stamp))
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [start(code, pretrain_args(data, tmp_path / "run", 2), {**common, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in (0, 1)]
    (rc0, rc1), (err0, err1), seconds = finish(procs, stamp)
    assert rc0 == 1 and "injected failure at step 3" in err0
    assert rc1 != 0 and "Connection closed by peer" in err1  # gloo tells rank 1 at its next collective
    assert seconds < LIMIT


def test_end_workers_kills_the_loaders_workers_only(data):
    """The mechanism: a loader's workers (which ignore SIGTERM) are gone after end_workers; a daemonic process of
    the caller's own is not touched."""
    import multiprocessing as mp

    from moquad.config import LoaderConfig
    from moquad.data.pipeline import make_loader

    own = mp.get_context("fork").Process(target=_ignore_and_sleep, daemon=True)
    own.start()
    it = iter(make_loader(data, LoaderConfig(frames=4, size=16, workers=2), batch_size=2))
    next(it)
    procs = list(it._workers)
    procs[0].terminate()  # SIGTERM: ignored, as multiprocessing's exit handler found it
    procs[0].join(1.0)
    assert procs[0].is_alive()
    t0 = time.time()
    assert workers.end_workers() == 2
    assert not any(p.is_alive() for p in procs) and time.time() - t0 < 5
    assert [p.exitcode for p in procs] == [-9, -9]
    assert workers.end_workers() == 0
    assert own.is_alive()  # not the loader's: left alone
    own.kill()
    own.join()


# A caller's own Pool has tasks in flight (started at step 1) when the run fails at step 2.
POOL_SURVIVES = """
import multiprocessing as mp, sys, time
import moquad.train.loop as L

def slow_square(x):
    time.sleep(4)
    return x * x

pool, pending, real = mp.get_context("fork").Pool(2), [], L.forward_loss
def forward_loss(*a, **k):
    if not pending:
        pending.append(pool.map_async(slow_square, range(4)))
        return real(*a, **k)
    raise RuntimeError("injected failure at step 2")
L.forward_loss = forward_loss
from moquad.cli import main
sys.argv[0] = "moquad"
try:
    main()
except BaseException as e:
    print("run ended:", repr(e), flush=True)
print("pool:", pending[0].get(timeout=60), flush=True)
"""

# The run on a thread (as Ray Train's runner thread or a notebook helper runs it) fails at step 3.
ON_A_THREAD = """
import multiprocessing as mp, sys, threading
import moquad.train.loop as L
real, calls = L.forward_loss, []
def forward_loss(*a, **k):
    calls.append(1)
    if len(calls) == 3:
        raise RuntimeError("injected failure at step 3")
    return real(*a, **k)
L.forward_loss = forward_loss
from moquad.cli import main
sys.argv[0] = "moquad"
errors = []
def run():
    try:
        main()
    except BaseException as e:
        errors.append(e)
t = threading.Thread(target=run)
t.start()
t.join()
print("error:", repr(errors[0]), flush=True)
print("children:", [p.pid for p in mp.active_children()], flush=True)
"""


def test_a_callers_pool_survives_a_failing_run(data, tmp_path):
    """A sweep driver's multiprocessing.Pool with tasks in flight: the failing run ends its loader workers only,
    and the pool's map_async().get() returns the tasks' results."""
    p = start(POOL_SURVIVES, pretrain_args(data, tmp_path / "run", 2), {})
    out, err = p.communicate(timeout=240)
    assert "run ended: RuntimeError('injected failure at step 2')" in out, err
    assert "pool: [0, 1, 4, 9]" in out, err
    assert p.returncode == 0


def test_a_run_failing_on_a_thread_raises_its_error_and_ends_its_workers(data, tmp_path):
    """Off the main thread no signal handler can be set: the real error comes out and no loader worker is left."""
    p = start(ON_A_THREAD, pretrain_args(data, tmp_path / "run", 2), {})
    out, err = p.communicate(timeout=240)
    assert "error: RuntimeError('injected failure at step 3')" in out, err
    assert "children: []" in out, out + err
    assert p.returncode == 0


def _ignore_and_sleep() -> None:
    workers.ignore_preemption(0)
    time.sleep(120)
