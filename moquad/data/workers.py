"""Loader worker processes: they ignore the preemption signals, and a failing run ends them at once.

SLURM signals every process of a job step, loader workers included. A worker killed by that SIGTERM would fail
the step its rank is finishing before the preemption checkpoint, so workers ignore SIGTERM / SIGUSR1
(:func:`ignore_preemption`, the DataLoader's ``worker_init_fn``) and their rank stops them.

The price: when an exception ends a run, the live loader iterator is still referenced by the traceback,
Python's multiprocessing exit handler sends the (daemonic) workers SIGTERM and joins them, and the process
hangs forever, holding its nodes. :func:`end_workers` kills them first (SIGKILL cannot be ignored): only the
workers of moquad's own loaders (:func:`track`), never a caller's processes (a ``multiprocessing.Pool`` of a
sweep driver or a notebook), and from any thread (Ray Train runs the training function on a thread of its own).
"""

from __future__ import annotations

import signal
import weakref
from typing import Any

from torch.utils.data._utils import signal_handling

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
JOIN_TIMEOUT = 10.0  # seconds to wait for a killed worker to be reaped

_iterators: weakref.WeakSet = weakref.WeakSet()  # live multi-process iterators of moquad's loaders


def ignore_preemption(_worker_id: int) -> None:
    """``worker_init_fn`` of the DataLoader: workers ignore the preemption signals (their rank stops them)."""
    for s in PREEMPTION_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def track(iterator: Any) -> Any:
    """Remember a DataLoader iterator's worker processes for :func:`end_workers`; returns the iterator."""
    if getattr(iterator, "_workers", None):
        _iterators.add(iterator)
    return iterator


def end_workers() -> int:
    """SIGKILL the live workers of moquad's loaders (:func:`track`) and reap them; returns how many.

    torch's SIGCHLD handler would turn each death into a "DataLoader worker is killed" RuntimeError raised over
    the error that is ending the run, so the iterator's workers are first taken off its watch list (what the
    iterator's own shutdown does); no signal handler is changed, so this works on any thread.
    """
    ended = 0
    for it in list(_iterators):
        if getattr(it, "_worker_pids_set", False):
            signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
        alive = [p for p in it._workers if p.is_alive()]
        for p in alive:
            p.kill()
        for p in alive:
            p.join(JOIN_TIMEOUT)
        ended += len(alive)
        _iterators.discard(it)
    return ended
