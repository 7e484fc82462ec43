"""The progress of a pre-training run, as its user watches it: a live bar on a terminal, a line per epoch in a log.

A live bar shows nothing useful once piped to a file (rich prints it once, when the run ends), so a run whose
output is not a terminal prints one line per finished epoch instead, with the same numbers: the epoch, the step,
videos per second, the time elapsed and the last logged loss.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class EpochColumn(ProgressColumn):
    """``epoch 3/200``: the epoch the current step belongs to."""

    def __init__(self, steps_per_epoch: int, epochs: int) -> None:
        super().__init__()
        self.spe, self.epochs = steps_per_epoch, epochs

    def render(self, task: Task) -> Text:
        return Text(f"epoch {min(int(task.completed) // self.spe + 1, self.epochs)}/{self.epochs}")


class VideosColumn(ProgressColumn):
    """``812.4 videos/s``: rich's step rate (over its recent updates) times the global batch."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch = batch_size

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed * self.batch:.1f} videos/s" if task.speed else "- videos/s")


def progress(enabled: bool, total: int, completed: int, steps_per_epoch: int, batch_size: int,
             terminal: bool | None = None) -> tuple[Any, Any]:
    """The run's progress display and its task (``update(task, completed=step, info=...)`` at each log step):
    on a terminal, a live bar (epoch, bar, step, videos/s, time elapsed < time left, the loss); otherwise
    (``terminal`` False; None asks the console) an :class:`EpochLines`. ``enabled`` False: nothing is shown."""
    epochs = max(1, -(-total // steps_per_epoch))
    if terminal is None:
        terminal = Console().is_terminal
    if enabled and not terminal:
        prog: Any = EpochLines(steps_per_epoch, epochs, batch_size, completed)
    else:
        prog = Progress(EpochColumn(steps_per_epoch, epochs), BarColumn(), MofNCompleteColumn(), VideosColumn(batch_size),
                        TimeElapsedColumn(), TextColumn("<"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                        disable=not enabled)
    return prog, prog.add_task("pretrain", total=total, completed=completed, info="")


class EpochLines:
    """A line per finished epoch (``epoch 3/200: step 300/20000, 812.4 videos/s, 0:05:12 elapsed, moquad loss
    4.1234 lr 3.2``); videos/s over that epoch. Keeps the task as ``rich.progress.Progress`` does (``tasks``,
    ``add_task``, ``update``, a context manager), so the trainer drives both the same way."""

    def __init__(self, steps_per_epoch: int, epochs: int, batch_size: int, completed: int) -> None:
        self.inner = Progress(disable=True)  # holds the task; shows nothing
        self.spe, self.epochs, self.batch = steps_per_epoch, epochs, batch_size
        self.start = self.mark = time.perf_counter()
        self.printed = self.mark_step = completed  # step of the last line (a resumed run starts mid-way)

    @property
    def tasks(self) -> list[Task]:
        return self.inner.tasks

    def add_task(self, *args: Any, **kw: Any) -> Any:
        return self.inner.add_task(*args, **kw)

    def update(self, task: Any, **kw: Any) -> None:
        self.inner.update(task, **kw)
        done = int(self.inner.tasks[0].completed)
        if done // self.spe > self.printed // self.spe:
            self.line(done)

    def line(self, done: int) -> None:
        """Print the line of the epochs finished by step ``done``."""
        now = time.perf_counter()
        rate = (done - self.mark_step) * self.batch / max(now - self.mark, 1e-9)
        task = self.inner.tasks[0]
        info = task.fields.get("info", "")
        print(f"epoch {min(done // self.spe, self.epochs)}/{self.epochs}: step {done}/{int(task.total or 0)}, "
              f"{rate:.1f} videos/s, {datetime.timedelta(seconds=round(now - self.start))} elapsed"
              + (f", {info}" if info else ""), flush=True)
        self.printed, self.mark, self.mark_step = done, now, done

    def __enter__(self) -> EpochLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        done = int(self.inner.tasks[0].completed) if self.inner.tasks else self.printed
        if exc[0] is None and done > self.printed:  # the run ended between two epoch boundaries
            self.line(done)
