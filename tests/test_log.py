"""The run log (moquad.train.log): cut back to the resumed step, and the cut replaces the old log atomically."""

from __future__ import annotations

import errno
import json

import pytest

from moquad.errors import MoquadError
from moquad.train.log import RunLogger, read_log


def write_steps(path, n: int) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, n + 1)))


def test_resume_cuts_the_log_back_then_appends(tmp_path):
    write_steps(tmp_path / "log.jsonl", 10)
    logger = RunLogger(tmp_path, start_step=4, tensorboard=False)
    logger.log(5, {"loss": float("nan"), "lr": 0.1})
    logger.close()
    records = read_log(tmp_path / "log.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[3]["loss"] == 0.25 and records[4] == {"step": 5, "loss": None, "lr": 0.1}


def test_a_failed_cut_keeps_the_whole_old_log(tmp_path, monkeypatch):
    """Rewritten in place before: a full disk (or a kill) during the cut lost the log of the steps before it."""
    write_steps(tmp_path / "log.jsonl", 10)

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("moquad.io.os.fsync", fsync)
    with pytest.raises(MoquadError, match="no space left on device while writing .*log.jsonl"):
        RunLogger(tmp_path, start_step=4, tensorboard=False)
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == list(range(1, 11))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]  # no temp file left


def test_tensorboard_gets_the_curves_not_the_time_or_the_step_count(tmp_path):
    """``time`` (a Unix time: float32 rounds it to minutes) and ``steps`` (the steps a record averages) are record
    fields, not curves: TensorBoard gets the losses and the lr, and the record's time as each point's wall time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = RunLogger(tmp_path)
    logger.log(10, {"loss": 2.5, "lr": 0.1, "steps": 1, "time": 1767225600.25, "bad_samples": 0})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/bad_samples", "train/loss", "train/lr"]
    (point,) = events.Scalars("train/loss")
    assert (point.step, point.value, point.wall_time) == (10, 2.5, 1767225600.25)
