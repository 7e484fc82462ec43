"""Preemption (moquad.train.preempt): SIGUSR1 / SIGTERM mid-epoch -> checkpoint -> exit 75 -> ``--resume`` gives
bit-for-bit the run that was never interrupted; the SLURM script requeues on that code and resumes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_loop import fake_loader, make_cfg, train

from moquad import settings
from moquad.config import PretrainConfig
from moquad.train import checkpoint, preempt
from moquad.train.checkpoint import load
from moquad.train.log import read_log
from moquad.train.optimizers import pretrain_optimizer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def signalling(signum: int, at: int, steps_per_epoch: int = 4):
    """fake_loader that sends ``signum`` to this process while it hands out global step ``at`` (0-based)."""

    def loader(*a, **kw):
        for i, batch in enumerate(fake_loader(*a, **kw)):
            if kw["epoch"] * steps_per_epoch + kw["start"] + i == at:
                os.kill(os.getpid(), signum)
            yield batch

    return loader


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    train(make_cfg(out), fake_loader, tensorboard=False, progress=False)
    return out


@pytest.mark.parametrize("signum, at", [(signal.SIGUSR1, 4), (signal.SIGTERM, 9)])
def test_signal_mid_epoch_then_resume_is_bit_identical(uninterrupted, tmp_path, signum, at, capsys):
    out = tmp_path / "run"
    before = signal.getsignal(signum)
    with pytest.raises(preempt.Preempted) as e:
        train(make_cfg(out), signalling(signum, at), tensorboard=False, progress=False)
    assert e.value.code == preempt.REQUEUE_EXIT == 75 and e.value.step == at + 1  # the current step finished
    assert signal.getsignal(signum) is before  # the previous handler is back
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"preempted: {signal.Signals(signum).name} received, stopped after step {at + 1}")
    seconds = float(re.search(r"([\d.]+) s after the signal", line)[1])
    assert 0 <= seconds == pytest.approx(e.value.seconds, abs=0.01) and seconds < 30
    ckpt = load(out / "checkpoints" / "last.pt")
    assert (ckpt["step"], ckpt["epoch"]) == (at + 1, (at + 1) // 4)  # not a ckpt_every (3) step: written for the stop
    assert not [p for p in (out / "checkpoints").iterdir() if p.name != "last.pt"]  # no temp file

    train(make_cfg(out, resume=True), fake_loader, tensorboard=False, progress=False)
    a, b = read_log(uninterrupted / "log.jsonl"), read_log(out / "log.jsonl")
    assert [r["step"] for r in b] == list(range(1, 13))
    assert [r["loss"] for r in b] == [r["loss"] for r in a]  # exactly: same floats
    sa, sb = load(uninterrupted / "checkpoints" / "last.pt"), load(out / "checkpoints" / "last.pt")
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    for k, state in sa["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb["optimizer"]["state"][k][name]))


def test_a_signal_after_the_last_step_ends_normally(tmp_path):
    """A signal while the last batch is handed out: the run is complete, nothing to requeue."""
    cfg = make_cfg(tmp_path / "run", epochs=1)
    assert train(cfg, signalling(signal.SIGUSR1, 3), tensorboard=False, progress=False)
    assert load(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 4


def test_workers_ignore_the_preemption_signals():
    code = ("import os, signal, time\nfrom moquad.data.workers import ignore_preemption\nignore_preemption(0)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\nos.kill(os.getpid(), signal.SIGTERM)\nprint('alive')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "alive", res.stderr


# ----------------------------------------------------------------------------- the SLURM script, with fake srun


FAKE_SRUN = """#!/usr/bin/env bash
# fake srun: one task; sends SIGUSR1 (SLURM's --signal=USR1@120) once the run has logged a step
while [[ "$1" == --* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1
before=$(cat "$WATCH/log.jsonl" 2>/dev/null | wc -l)
"$@" &
child=$!
for _ in $(seq 1200); do
  [ "$(cat "$WATCH/log.jsonl" 2>/dev/null | wc -l)" -gt "$before" ] && break
  kill -0 $child 2>/dev/null || break
  sleep 0.05
done
kill -USR1 $child 2>/dev/null
wait $child
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
case "$1" in show) echo 127.0.0.1 ;; requeue) echo "requeue $2" >> "$REQUEUED" ;; esac
"""


def test_slurm_script_requeues_on_preemption_and_the_requeued_job_resumes(tmp_path):
    from video_fixtures import coded_dataset

    data = coded_dataset(tmp_path / "data", num_videos=8, num_frames=12, videos_per_shard=4)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "WATCH": str(out),
           "REQUEUED": str(tmp_path / "requeued"), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1",
           "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    args = ["--data", data, "--out", out, "--backbone", "tiny", "--batch-size", "2", "--frames", "4", "--size", "32",
            "--workers", "0", "--device", "cpu", "--epochs", "200", "--warmup-ratio", "0", "--set", "proj_hidden=16"]

    def sbatch(restarts: int) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "scripts" / "pretrain_slurm.sbatch"), *map(str, args)], cwd=REPO,
                              env={**env, "SLURM_RESTART_COUNT": str(restarts)}, capture_output=True, text=True,
                              timeout=300)

    first = sbatch(0)
    assert first.returncode == 75, first.stderr
    assert "preempted: SIGUSR1 received" in first.stderr
    assert (tmp_path / "requeued").read_text() == "requeue 4242\n"
    step1 = load(out / "checkpoints" / "last.pt")["step"]
    assert 1 <= step1 < 800
    second = sbatch(1)  # the requeued job: continues (--resume) and is preempted again
    assert second.returncode == 75, second.stderr
    assert (tmp_path / "requeued").read_text() == "requeue 4242\n" * 2
    steps = [r["step"] for r in read_log(out / "log.jsonl")]
    assert steps == list(range(1, len(steps) + 1)) and load(out / "checkpoints" / "last.pt")["step"] > step1


def test_a_rank_that_got_no_signal_says_so_without_a_nan_time():
    """Only another rank got the signal: rank 0 printed "nan s after the signal"."""
    preempt._received.clear()
    e = preempt.preempted(12)
    assert (e.signame, e.step, e.code) == ("a signal on another rank", 12, 75)
    assert e.message("RUN/checkpoints/last.pt", "DATA") == (
        "preempted: a signal on another rank received, stopped after step 12 and wrote RUN/checkpoints/last.pt; "
        "exit code 75 (requeue, or continue with `moquad pretrain --data DATA --out RUN --recipe RUN/config.yaml "
        "--resume`)")


def interrupting(at: int, steps_per_epoch: int = 4):
    """fake_loader that raises KeyboardInterrupt (Ctrl-C) instead of handing out global step ``at`` (0-based)."""

    def loader(*a, **kw):
        for i, batch in enumerate(fake_loader(*a, **kw)):
            if kw["epoch"] * steps_per_epoch + kw["start"] + i == at:
                raise KeyboardInterrupt
            yield batch

    return loader


def test_ctrl_c_names_the_last_checkpoint_its_step_and_the_command_that_continues(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = make_cfg(out, resume=True)  # --resume on an empty folder: says so, starts fresh
    with pytest.raises(preempt.Interrupted) as e:
        train(cfg, interrupting(at=11), tensorboard=False, progress=False)
    assert e.value.code == preempt.INTERRUPT_EXIT == 130
    std = capsys.readouterr()
    assert f"no checkpoint in {out}: starting fresh" in std.out.splitlines()
    ckpt = out / "checkpoints" / "last.pt"
    cmd = f"moquad pretrain --data unused --out {out} --recipe {out / 'config.yaml'} --resume"
    assert std.err.strip().splitlines()[-1] == (  # ckpt_every 3: the checkpoint is step 9, the log showed 11
        f"interrupted: Ctrl-C after step 11; the last checkpoint, {ckpt}, holds step 9; steps 10-11 are trained again "
        f"on resume; exit code 130 (continue with `{cmd}`)")
    assert load(ckpt)["step"] == preempt.saved_step(ckpt) == 9
    # the command's settings are the run's: --recipe RUN/config.yaml with --data, --out and --resume
    resolved = settings.resolve(PretrainConfig(), out / "config.yaml", {"data": "unused", "out": str(out),
                                                                         "resume": True})
    assert resolved == pretrain_optimizer(cfg)[0]  # the run's config.yaml holds the settled optimizer settings
    train(resolved, fake_loader, tensorboard=False, progress=False)
    assert (f"resuming from {ckpt} at step 9 of 12 (continuing at step 2 of 4 in epoch 3 of 3)"
            in capsys.readouterr().out.splitlines())
    assert [r["step"] for r in read_log(out / "log.jsonl")] == list(range(1, 13))


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(tmp_path, capsys):
    with pytest.raises(preempt.Interrupted):
        train(make_cfg(tmp_path / "run"), interrupting(at=2), tensorboard=False, progress=False)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted: Ctrl-C after step 2, before the run's first checkpoint (written every 3 steps and at each "
        "epoch's end): nothing to resume; exit code 130 (re-run the same command to start again)")


@pytest.mark.parametrize("start, line", [
    (0, "resuming from RUN/checkpoints/last.pt at step 0 of 12 (continuing at the start of epoch 1 of 3)"),
    (8, "resuming from RUN/checkpoints/last.pt at step 8 of 12 (continuing at the start of epoch 3 of 3)"),
    (9, "resuming from RUN/checkpoints/last.pt at step 9 of 12 (continuing at step 2 of 4 in epoch 3 of 3)"),
    (12, "resuming from RUN/checkpoints/last.pt at step 12 of 12: all 3 epochs are done, nothing to train"),
])
def test_resume_line(tmp_path, monkeypatch, start, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "RUN" / "checkpoints").mkdir(parents=True)
    path = Path("RUN/checkpoints/last.pt")
    assert checkpoint.resume_message(path, start, 4, 3) == "no checkpoint in RUN: starting fresh"
    path.write_bytes(b"x")
    assert checkpoint.resume_message(path, start, 4, 3) == line


def test_rank_0_leaves_the_requeue_marker_only_when_asked(tmp_path, monkeypatch):
    marker = tmp_path / "moquad-preempted-4242-0"
    monkeypatch.delenv("MOQUAD_PREEMPTED", raising=False)
    preempt.mark()
    assert not marker.exists()
    monkeypatch.setenv("MOQUAD_PREEMPTED", str(marker))
    preempt.mark()
    assert marker.is_file()


def test_the_bad_sample_count_goes_on_after_a_mid_epoch_resume(tmp_path):
    """It restarted at 0: an epoch with too many unreadable samples, cut by a preemption, never stopped."""
    from moquad.errors import MoquadError

    def one_bad_per_batch(inner):
        def loader(*a, **kw):
            for i, batch in enumerate(inner(*a, **kw)):
                step = kw["epoch"] * 4 + kw["start"] + i + 1
                yield {**batch, "bad": [{"video_id": f"v{step}", "shard": "s.tar", "reason": "test", "epoch": 0}]}
        return loader

    cfg = dict(epochs=1, warmup_ratio=0.0, loader=dataclasses.replace(make_cfg("x").loader, max_bad_count=3,
                                                                           max_bad_fraction=0.0))
    out = tmp_path / "run"
    with pytest.raises(preempt.Preempted):  # stopped after step 2, with 2 skips on record
        train(make_cfg(out, **cfg), one_bad_per_batch(signalling(signal.SIGUSR1, 1)), tensorboard=False,
              progress=False)
    log = out / "bad_samples.jsonl"
    with open(log, "a") as f:  # steps a killed run did after its checkpoint, and its torn last line
        f.write('{"video_id": "x3", "step": 3}\n{"video_id": "x4", "step": 4}\n{"video_id": "x5", "st')
    with pytest.raises(MoquadError, match=r"^4 of epoch 0's 16 samples were unreadable"):
        train(make_cfg(out, resume=True, **cfg), one_bad_per_batch(fake_loader), tensorboard=False, progress=False)
    assert [json.loads(x)["video_id"] for x in log.read_text().splitlines()] == ["v1", "v2", "v3", "v4"]
