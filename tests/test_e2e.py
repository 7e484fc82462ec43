"""Every CLI command end to end, as a user runs them, on tiny synthetic videos and real clips."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import cli_child as clirun
import numpy as np
import pytest


def moquad(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = clirun.python("-m", "moquad.cli", *map(str, args),
                            cwd=cwd, timeout=600)
    assert result.returncode == 0, f"moquad {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """synth -> preprocess -> verify -> pretrain (tiny, 1 epoch), shared by the tests below."""
    tmp = tmp_path_factory.mktemp("e2e")
    moquad("synth", tmp / "raw", "--classes", 3, "--per-class", 4, "--size", 32, "--frames", 20)
    moquad("preprocess", "ucf101", tmp / "raw", "--out", tmp / "shards", "--short-side", 32, "--workers", 1)
    assert "OK" in moquad("verify", tmp / "shards").stdout
    moquad("pretrain", "--data", tmp / "shards", "--out", tmp / "run", "--method", "moquad", "--backbone", "tiny",
           "--epochs", 2, "--batch-size", 4, "--frames", 4, "--size", 32, "--workers", 0, "--warmup-ratio", 0.5,
           "--device", "cpu")
    return tmp


def test_pretrain_outputs(pipeline):
    run = pipeline / "run"
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "config.yaml").is_file()
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses and all(v == v and v > 0 for v in losses)  # finite, positive InfoNCE values
    moquad("plot", run)
    assert (run / "curves.png").stat().st_size > 1000


def test_retrieve_and_linear(pipeline):
    ckpt = pipeline / "run" / "checkpoints" / "last.pt"
    common = ["--data", pipeline / "shards", "--checkpoint", ckpt, "--frames", 4, "--size", 32, "--device", "cpu"]
    moquad("retrieve", *common, "--num-clips", 2, "--json", pipeline / "ret.json", "--out", pipeline / "eval")
    res = json.loads((pipeline / "ret.json").read_text())
    for k in (1, 5, 10):
        assert 0.0 <= res[f"top{k}"] <= 1.0
    assert res["top1"] <= res["top5"] <= res["top10"]
    assert res["queries"] == res["data"]["manifests"]["test"]["videos"] > 0 and 0 <= res["knn_top1"] <= 1
    moquad("linear", "--data", pipeline / "shards", "--checkpoint", ckpt, "--epochs", 3, "--out", pipeline / "eval",
           "--device", "cpu", "--size", 32, "--frames", 4, "--num-clips", 2)
    lin = json.loads((pipeline / "eval" / "linear_fast.json").read_text())
    conf = np.array(lin["confusion"])  # the reported accuracies are those of the confusion matrix
    assert conf.sum() == lin["videos"] == res["queries"]
    assert lin["top1"] == pytest.approx(np.trace(conf) / conf.sum())
    assert lin["mean_class_accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in lin["per_class"]]))
    assert lin["protocol"]["features"]["size"] == 32 and lin["protocol"]["features"]["frames"] == 4


def test_finetune_and_cam(pipeline, real_videos_dir):
    ckpt = pipeline / "run" / "checkpoints" / "last.pt"
    moquad("finetune", "--data", pipeline / "shards", "--checkpoint", ckpt, "--epochs", 1, "--batch-size", 4,
           "--frames", 4, "--size", 32, "--num-clips", 2, "--crops", 1, "--out", pipeline / "ft", "--device", "cpu")
    ft = json.loads((pipeline / "ft" / "finetune.json").read_text())
    preds = ft["predictions"]
    assert len(preds) == ft["videos"] == np.array(ft["confusion"]).sum() > 0
    assert ft["top1"] == pytest.approx(np.mean([p["pred"] == p["label"] for p in preds]))
    assert len(ft["train_loss_per_epoch"]) == 1 and ft["train_loss_per_epoch"][0] > 0
    assert (pipeline / "ft" / "finetune_model.pt").is_file() and (pipeline / "ft" / "finetune_confusion.png").is_file()
    # the supervised bound: the same backbone from random init, no checkpoint needed
    moquad("finetune", "--data", pipeline / "shards", "--init", "random", "--backbone", "tiny", "--epochs", 1,
           "--batch-size", 4, "--frames", 4, "--size", 32, "--num-clips", 1, "--out", pipeline / "ft0", "--device", "cpu")
    ft0 = json.loads((pipeline / "ft0" / "finetune_random.json").read_text())
    assert ft0["checkpoint"] is None and ft0["protocol"]["init"].startswith("random") and ft0["videos"] == ft["videos"]
    video = shutil.copy(real_videos_dir / "v_SoccerJuggling_g23_c01.avi", pipeline / "clip.avi")
    moquad("cam", video, "--checkpoint", ckpt, "--out", pipeline / "cam.png", "--frames", 4, "--size", 32,
           "--device", "cpu")
    assert (pipeline / "cam.png").stat().st_size > 1000


def test_pretrain_with_augmentation_on_device(pipeline):
    """Workers only decode; crop/flip/colour/RAD run in the training process (the GPU path)."""
    run = pipeline / "run_aod"
    moquad("pretrain", "--data", pipeline / "shards", "--out", run, "--backbone", "tiny", "--epochs", 1,
           "--batch-size", 2, "--frames", 4, "--size", 32, "--workers", 1, "--augment-on-device",
           "--warmup-ratio", 0, "--steps-per-epoch", 2, "--device", "cpu")
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2 and all(r["loss"] > 0 and r["mode"] == "moquad" for r in rows)
