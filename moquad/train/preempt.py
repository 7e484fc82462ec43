"""Preemption: SIGTERM or SIGUSR1 -> finish the current step, write a checkpoint, exit with :data:`REQUEUE_EXIT`.

SLURM sends SIGUSR1 ahead of the time limit (``#SBATCH --signal=USR1@120``) and SIGTERM when it preempts
or cancels a job; spot instances send SIGTERM. The handler only records the signal. The training loop
reads :func:`requested` at its log steps, where each rank's flag is reduced (max) together with the
step's other numbers, so every rank stops after the same step at no extra cost. Rank 0 then writes the
checkpoint, all ranks wait for it (a barrier) and raise :class:`Preempted`: a ``SystemExit`` with code
75 (``EX_TEMPFAIL`` of sysexits.h, "try again later"); ``scripts/pretrain_slurm.sbatch`` requeues the job
on that code and the requeued job continues with ``--resume``. DataLoader workers ignore both signals
(their rank stops them: :mod:`moquad.data.workers`).

Ctrl-C (SIGINT) ends a run at once (:class:`Interrupted`, exit code 130) with a line naming the last checkpoint
written, its step and the command to continue (:func:`interrupted_message`); both lines come from
:func:`stop_line`. A new checkpoint is not written then: the interrupt may land inside an optimizer update.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moquad.data.workers import PREEMPTION_SIGNALS

REQUEUE_EXIT = 75
INTERRUPT_EXIT = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


class Preempted(SystemExit):
    """Raised by every rank once the checkpoint of a preempted run is written; the exit code is REQUEUE_EXIT."""

    def __init__(self, step: int, signame: str, seconds: float) -> None:
        super().__init__(REQUEUE_EXIT)
        self.step, self.signame, self.seconds = step, signame, seconds

    def message(self, ckpt: str | Path, data: str) -> str:
        when = "" if math.isnan(self.seconds) else f" {self.seconds:.2f} s after the signal"
        return stop_line(f"preempted: {self.signame} received, stopped after step {self.step} and wrote {ckpt}{when}",
                         ckpt, data, REQUEUE_EXIT, "requeue, or ")


class Interrupted(SystemExit):
    """Raised by rank 0 on Ctrl-C once :func:`interrupted_message` is printed; the exit code is INTERRUPT_EXIT."""

    def __init__(self) -> None:
        super().__init__(INTERRUPT_EXIT)


def continue_command(run: str | Path, data: str) -> str:
    """The command that continues the run in ``run`` on ``data``: its saved settings (``RUN/config.yaml``) and
    ``--resume``."""
    return f"moquad pretrain --data {data} --out {run} --recipe {Path(run) / 'config.yaml'} --resume"


def stop_line(what: str, ckpt: str | Path, data: str, code: int, how: str = "") -> str:
    """The one line a stopped run prints (preempted or interrupted): what happened, the exit code, the command
    to continue (under torchrun or srun, with the same launcher)."""
    return f"{what}; exit code {code} ({how}continue with `{continue_command(Path(ckpt).parent.parent, data)}`)"


def saved_step(ckpt: str | Path) -> int | None:
    """The step of the checkpoint at ``ckpt`` (memory-mapped: no tensor is read), None when there is none."""
    import torch

    try:
        return int(torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # absent, or not readable: nothing to resume from either way
        return None


def interrupted_message(ckpt: str | Path, data: str, logged: int, ckpt_every: int) -> str:
    """Ctrl-C's line: the last checkpoint written and its step (the steps after it, up to ``logged``, the last one
    the log showed, are trained again on resume), and the command to continue."""
    step = saved_step(ckpt)
    if step is None:
        return (f"interrupted: Ctrl-C after step {logged}, before the run's first checkpoint (written every "
                f"{ckpt_every} steps and at each epoch's end): nothing to resume; exit code {INTERRUPT_EXIT} "
                "(re-run the same command to start again)")
    steps = f"step {logged} is" if logged == step + 1 else f"steps {step + 1}-{logged} are"
    redo = f"; {steps} trained again on resume" if logged > step else ""
    return stop_line(f"interrupted: Ctrl-C after step {logged}; the last checkpoint, {ckpt}, holds step {step}{redo}",
                     ckpt, data, INTERRUPT_EXIT)


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
    """Touch ``$MOQUAD_PREEMPTED`` when set: ``scripts/pretrain_slurm.sbatch`` requeues on that file, not on srun's
    exit code (with --kill-on-bad-exit=1, a rank killed while exiting 75 makes that code 137)."""
    path = os.environ.get("MOQUAD_PREEMPTED")
    if path:
        with open(path, "a"):
            pass
