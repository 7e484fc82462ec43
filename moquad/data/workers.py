"""Loader worker processes: they ignore the preemption signals, and a failing run ends them at once.

SLURM signals every process of a job step, loader workers included. A worker killed by that SIGTERM would fail
the step its rank is finishing before the preemption checkpoint, so workers ignore SIGTERM / SIGUSR1
(:func:`ignore_preemption`, the DataLoader's ``worker_init_fn``) and their rank stops them.

The price: when an exception ends a run, the live loader iterator is still referenced by the traceback,
Python's multiprocessing exit handler sends the (daemonic) workers SIGTERM and joins them, and the process
hangs forever, holding its nodes. :func:`end_workers` kills them first (SIGKILL cannot be ignored).
"""

from __future__ import annotations

import multiprocessing
import signal

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
JOIN_TIMEOUT = 10.0  # seconds to wait for a killed worker to be reaped


def ignore_preemption(_worker_id: int) -> None:
    """``worker_init_fn`` of the DataLoader: workers ignore the preemption signals (their rank stops them)."""
    for s in PREEMPTION_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def end_workers() -> int:
    """SIGKILL this process's daemonic children (the DataLoader workers) and reap them; returns how many.

    torch's SIGCHLD handler would turn each death into a "DataLoader worker is killed" RuntimeError raised over
    the error that is ending the run, so it is set aside while they die.
    """
    workers = [p for p in multiprocessing.active_children() if p.daemon]
    if not workers:
        return 0
    previous = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        for p in workers:
            p.kill()
        for p in workers:
            p.join(JOIN_TIMEOUT)
    finally:
        signal.signal(signal.SIGCHLD, previous if previous is not None else signal.SIG_DFL)
    return len(workers)
