"""The progress of a run: the loss it trains (a SimCLR run never shows "moquad loss"), the epoch, videos/s and the
time elapsed; a line per epoch when the output is not a terminal."""

from __future__ import annotations

import io

import pytest
from test_loop import fake_loader, make_cfg, train


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("method, want", [("simclr", ["appearance", "simclr"]), ("simclr_classic", ["simclr", "simclr"]),
                                          ("moquad", ["appearance", "moquad"])])
def test_progress_bar_names_the_loss_of_the_method(tmp_path, monkeypatch, method, want):
    from rich.progress import Progress

    seen = []
    real = Progress.update
    monkeypatch.setattr(Progress, "update", lambda self, task, **kw: (seen.append(kw.get("info", "")),
                                                                      real(self, task, **kw))[1])
    train(make_cfg(tmp_path / "p", method=method, epochs=2, steps_per_epoch=1, warmup_ratio=0.5), fake_loader, tensorboard=False)
    assert [s.split(" loss ")[0] for s in seen if s] == want


def test_a_run_piped_to_a_file_prints_a_line_per_epoch(tmp_path, capsys):
    """Not on a terminal (pytest's captured output), the run says each epoch once, with its step, speed, time and
    loss, instead of one final bar whose 0:00:00 is the time left."""
    train(make_cfg(tmp_path / "p", method="moquad", epochs=3, steps_per_epoch=2, warmup_ratio=0.34), fake_loader,
          tensorboard=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert [line.split(",")[0] for line in lines] == ["epoch 1/3: step 2/6", "epoch 2/3: step 4/6", "epoch 3/3: step 6/6"]
    assert all(" videos/s, 0:00:" in line and " elapsed, " in line for line in lines)
    assert "appearance loss" in lines[0] and "moquad loss" in lines[2]


def test_epoch_lines_measure_videos_per_second_and_elapsed_time(monkeypatch, capsys):
    """Each line's videos/s is its epoch's (steps x global batch / seconds), the elapsed time the run's; an update
    inside an epoch prints nothing; the run's end prints the steps after the last boundary."""
    from moquad.train import progress

    clock = iter([100.0, 101.0, 102.0, 104.0, 105.0, 106.0])  # start, then one reading per printed line
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    prog, task = progress.progress(True, total=5, completed=0, steps_per_epoch=2, batch_size=8, terminal=False)
    with prog:
        for step in range(1, 6):
            prog.update(task, completed=step, info=f"moquad loss {step}.0000 lr 0.1")
    assert capsys.readouterr().out.splitlines() == [
        "epoch 1/3: step 2/5, 16.0 videos/s, 0:00:01 elapsed, moquad loss 2.0000 lr 0.1",
        "epoch 2/3: step 4/5, 16.0 videos/s, 0:00:02 elapsed, moquad loss 4.0000 lr 0.1",
        "epoch 2/3: step 5/5, 4.0 videos/s, 0:00:04 elapsed, moquad loss 5.0000 lr 0.1"]
    assert prog.tasks[0].completed == 5


def test_the_live_bar_shows_epoch_videos_per_second_and_elapsed_time():
    from types import SimpleNamespace

    from rich.console import Console

    from moquad.train import progress

    prog, task = progress.progress(True, total=6, completed=3, steps_per_epoch=2, batch_size=8, terminal=True)
    titles = [type(c).__name__ for c in prog.columns]
    assert titles[:2] == ["EpochColumn", "BarColumn"] and "VideosColumn" in titles and "TimeElapsedColumn" in titles
    console = Console(record=True, width=150, file=io.StringIO())
    console.print(prog.make_tasks_table(prog.tasks))
    text = console.export_text()
    assert "epoch 2/3" in text and "3/6" in text and "- videos/s" in text and "0:00:00" in text
    assert str(progress.VideosColumn(8).render(SimpleNamespace(speed=2.5))) == "20.0 videos/s"
