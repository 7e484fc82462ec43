"""Preemption: SIGTERM or SIGUSR1 -> finish the current step, write a checkpoint, exit with :data:`REQUEUE_EXIT`.

SLURM sends SIGUSR1 ahead of the time limit (``#SBATCH --signal=USR1@120``) and SIGTERM when it preempts
or cancels a job; spot instances send SIGTERM. The handler only records the signal. The training loop
reads :func:`requested` at its log steps, where each rank's flag is reduced (max) together with the
step's other numbers, so every rank stops after the same step at no extra cost. Rank 0 then writes the
checkpoint, all ranks wait for it (a barrier) and raise :class:`Preempted`: a ``SystemExit`` with code
75 (``EX_TEMPFAIL`` of sysexits.h, "try again later"); ``train/slurm_pretrain.sbatch`` requeues the job
on that code and the requeued job continues with ``--resume``. DataLoader workers ignore both signals
(their rank stops them: :mod:`moquad.data.workers`).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from moquad.data.workers import PREEMPTION_SIGNALS

REQUEUE_EXIT = 75


class Preempted(SystemExit):
    """Raised by every rank once the checkpoint of a preempted run is written; the exit code is REQUEUE_EXIT."""

    def __init__(self, step: int, signame: str, seconds: float) -> None:
        super().__init__(REQUEUE_EXIT)
        self.step, self.signame, self.seconds = step, signame, seconds

    def message(self, ckpt: str) -> str:
        when = "" if math.isnan(self.seconds) else f" {self.seconds:.2f} s after the signal"
        return (f"preempted: {self.signame} received, stopped after step {self.step} and wrote {ckpt}{when}; "
                f"exit code {REQUEUE_EXIT} (requeue, then continue with --resume)")


_received: dict[str, float] = {}  # signal name -> time.monotonic() of its first arrival


def _record(signum: int, _frame: object) -> None:
    _received.setdefault(signal.Signals(signum).name, time.monotonic())


@contextmanager
def watch() -> Iterator[None]:
    """Record SIGTERM / SIGUSR1 while the block runs (main thread only); the previous handlers come back after."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _record) for s in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def requested() -> bool:
    """True once this process got a preemption signal."""
    return bool(_received)


def preempted(step: int) -> Preempted:
    """The exception ending a run stopped after ``step`` (the first signal's name, the time since it came)."""
    name, at = min(_received.items(), key=lambda kv: kv[1]) if _received else ("a signal on another rank", None)
    return Preempted(step, name, time.monotonic() - at if at is not None else float("nan"))



def mark() -> None:
    """Touch ``$MOQUAD_PREEMPTED`` when set: ``train/slurm_pretrain.sbatch`` requeues on that file, not on srun's
    exit code (with --kill-on-bad-exit=1, a rank killed while exiting 75 makes that code 137)."""
    path = os.environ.get("MOQUAD_PREEMPTED")
    if path:
        with open(path, "a"):
            pass
