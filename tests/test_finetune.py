"""Fine-tuning: training runs and learns, the multi-view test averages softmax per video, outputs are complete."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from moquad import dist as moquad_dist
from moquad.config import ConfigError, EvalConfig
from moquad.data.augment import normalize
from moquad.data.clip_frames import uniform_clips
from moquad.errors import MoquadError
from moquad.eval.clips import spatial_crops
from moquad.eval.finetune import finetune, load_classifier
from moquad.settings import resolve


def test_finetune_end_to_end(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 12, "test": 6}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", num_clips=2, crops=3,
                   finetune={"epochs": 4, "batch_size": 4, "lr": 0.05, "optimizer": "sgd"})
    res = finetune(cfg)
    out = tmp_path / "out"
    for name in ("finetune.json", "finetune.txt", "finetune_confusion.png", "finetune_model.pt"):
        assert (out / name).is_file(), name
    assert (out / "finetune_confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "finetune.json").read_text())
    assert saved["top1"] == res["top1"] and saved["protocol"]["test"].startswith("2 clips x 3 crops")
    assert len(res["train_loss_per_epoch"]) == 4 and res["train_loss_per_epoch"][-1] < res["train_loss_per_epoch"][0]
    conf = np.array(res["confusion"])
    assert conf.sum() == 6 and np.trace(conf) / 6 == pytest.approx(res["top1"])
    assert [r["pred"] for r in res["predictions"]] == [r["pred"] for r in saved["predictions"]]

    # independent reference for one test video: 2 clips x 3 crops from raw frames, softmax averaged
    import pyarrow.parquet as pq

    from moquad.data.store import Split

    net, meta = load_classifier(out / "finetune_model.pt")
    assert meta["classes"] == ["Red", "Green", "Blue"]
    row = pq.read_table(data / "manifests" / "test.parquet").to_pylist()[2]
    idx = uniform_clips(row["num_frames"], 4, 2, 2)
    views = [spatial_crops(torch.from_numpy(Split(data, "test").read_frames(2, list(c))), 32, 3) for c in idx]
    with torch.no_grad():
        probs = net(normalize(torch.cat(views), torch.device("cpu"))).softmax(1).mean(0)
    pred = next(p for p in res["predictions"] if p["video_id"] == row["video_id"])
    assert pred["pred"] == int(probs.argmax())
    assert sum(r["videos"] for r in res["per_class"]) == 6


def test_finetune_settings_checked_when_built(tmp_path):
    from test_features import eval_cfg

    from moquad.settings import check_choices

    with pytest.raises(ConfigError, match="finetune.optimizer must be one of lars, sgd, adamw"):
        check_choices(eval_cfg(tmp_path, tmp_path, tmp_path, finetune={"optimizer": "adam9"}))
    with pytest.raises(ConfigError, match="finetune.init must be one of checkpoint, random"):
        eval_cfg(tmp_path, tmp_path, tmp_path, finetune={"init": "imagenet"})


def test_finetune_from_random_init_needs_no_checkpoint(tmp_path):
    """--init random: the backbone is built from its name and seeded, not loaded; the result says so."""
    from test_features import eval_cfg, make_tiny_dataset

    from moquad.models import build_backbone

    data = make_tiny_dataset(tmp_path / "data", {"train": 4, "test": 3}, frames=8)
    cfg = eval_cfg(data, "", tmp_path / "out", num_clips=1, seed=5,
                   finetune={"init": "random", "backbone": "tiny", "epochs": 1, "batch_size": 4, "lr": 1e-9,
                             "optimizer": "sgd"})
    res = finetune(cfg)
    assert res["checkpoint"] is None and res["protocol"]["init"].startswith("random")
    net, saved = load_classifier(tmp_path / "out" / "finetune_random_model.pt")
    assert saved["source_sha256"] is None and saved["config"] == {"backbone": "tiny"}
    torch.manual_seed(5)  # reference: the same seed's fresh backbone; lr 1e-9 leaves its weights (BN stats move)
    ref, _ = build_backbone("tiny")
    for k, v in ref.state_dict().items():
        if "running" not in k and "num_batches" not in k:
            torch.testing.assert_close(net.backbone.state_dict()[k], v, atol=1e-6, rtol=0)
    with pytest.raises(MoquadError, match="--backbone"):
        finetune(eval_cfg(data, "", tmp_path / "o2", finetune={"init": "random"}))


@pytest.mark.slow
def test_supervised_bound_at_demo_settings_beats_chance(tmp_path):
    """`moquad synth` motion classes, tiny backbone from random init, eval/cpu_demo.yaml's finetune settings
    (AdamW 1e-3, batch 8; 40 epochs to stay fast): test top-1 clearly above chance (1/3)."""
    from moquad.config import PreprocessConfig
    from moquad.eval.finetune import finetune
    from moquad.preprocess.run import preprocess
    from moquad.quickstart import EVAL_RECIPE, demo_recipe
    from moquad.synth import make_synth

    raw = make_synth(tmp_path / "raw", classes=3, per_class=12, size=32, frames=16, seed=0)
    data = tmp_path / "shards"
    preprocess(PreprocessConfig(dataset="ucf101", root=str(raw), out=str(data), short_side=32, workers=1), quiet=True)
    cfg = resolve(EvalConfig(), demo_recipe(EVAL_RECIPE), {"out": str(tmp_path / "out"), "device": "cpu", "num_clips": 2})
    assert (cfg.finetune.optimizer, cfg.finetune.lr, cfg.finetune.batch_size) == ("adamw", 0.001, 8)
    cfg = resolve(cfg, None, {"data": str(data), "seed": 0, "finetune.epochs": 40, "finetune.init": "random",
                              "finetune.backbone": "tiny"})  # the supervised bound: moquad finetune --init random
    res = finetune(cfg)
    assert res["videos"] >= 6 and res["top1"] >= 0.6, res["top1"]


def _ddp_worker(rank, world, port, cfg, result):
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        res = finetune(cfg)
        (result / f"rank{rank}.json").write_text(json.dumps({"top1": res["top1"], "ranks": res["protocol"]["ranks"],
                                                              "preds": res["predictions"]}))
    finally:
        moquad_dist.cleanup()  # what the CLI does on its way out


def test_finetune_on_two_ranks_predicts_every_video_once(tmp_path):
    import torch.multiprocessing as mp
    from s3server import free_port
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 6, "test": 5}, frames=8)
    ckpt = make_checkpoint(tmp_path / "c.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", num_clips=1, finetune={"epochs": 1, "batch_size": 4})
    mp.spawn(_ddp_worker, args=(2, free_port(), cfg, tmp_path), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1 and r0["ranks"] == 2  # both ranks report the same gathered result
    import pyarrow.parquet as pq

    ids = pq.read_table(data / "manifests" / "test.parquet").column("video_id").to_pylist()
    assert [p["video_id"] for p in r0["preds"]] == ids  # odd count, manifest order, no padding
    saved = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert saved["videos"] == 5 and np.sum(saved["confusion"]) == 5


def test_training_clips_flip_only_when_the_protocol_says(tmp_path):
    """``flip`` off (SSv2, direction classes): the same crops, never mirrored; on: some clips are mirrored."""
    from test_features import make_tiny_dataset

    from moquad.data.store import Split
    from moquad.eval.clips import TrainClips

    data = make_tiny_dataset(tmp_path / "data", {"train": 8, "test": 1}, frames=8)
    split = Split(data, "train")
    rows = np.arange(len(split))
    on, off = (TrainClips(split, rows, 4, 2, 16, flip, seed=3) for flip in (True, False))
    mirrored = 0
    for k in rows:
        a, b = on[k][0], off[k][0]
        mirrored += not torch.equal(a, b)
        assert torch.equal(a, b) or torch.equal(a, b.flip(-1))
    assert 0 < mirrored < len(rows)
    assert resolve(EvalConfig(), "eval/linear_ssv2.yaml", {}).linear.flip is False


class _Stop(Exception):
    pass


@pytest.mark.parametrize("backbone, optimizer, lr", [("swin3d_t", "adamw_vit", 2.5e-4), ("tiny", "lars", 0.08)])
def test_finetune_starts_with_the_backbone_rows_optimizer_and_says_so(tmp_path, monkeypatch, backbone, optimizer, lr):
    """``moquad finetune --init random --backbone swin3d_t`` without a recipe: the backbone row's optimizer (AdamW with
    layer-wise decay for the transformers, LARS for the CNNs) and its fine-tuning setting, in one line printed before
    training starts; the optimizer built is that row's."""
    from test_features import make_tiny_dataset
    from typer.testing import CliRunner

    import moquad.eval.finetune as F
    from moquad.cli import app
    from moquad.models import BACKBONES
    from moquad.train.optimizers import make_optimizer

    data = make_tiny_dataset(tmp_path / "data", {"train": 4, "test": 3}, frames=8)
    seen = {}

    def stop(net, cfg, *_a, **_k):  # training starts here: what was said by then, and the optimizer it builds
        seen["ft"], seen["opt"] = cfg.finetune, make_optimizer(net, cfg.finetune.optimizer, cfg.finetune.lr,
                                                               cfg.finetune.weight_decay, finetune=True)
        raise _Stop

    monkeypatch.setattr(F, "_train", stop)
    r = CliRunner().invoke(app, ["finetune", "--data", str(data), "--init", "random", "--backbone", backbone,
                                 "--out", str(tmp_path / "out"), "--frames", "4", "--size", "32"], terminal_width=200)
    assert isinstance(r.exception, _Stop), r.output
    assert BACKBONES[backbone].optimizer == optimizer
    said = [line for line in r.output.splitlines() if line.startswith("finetune: optimizer")]
    assert said == [f"finetune: optimizer {optimizer} (the {backbone} backbone's default), lr {lr:g}, weight decay "
                    f"{seen['ft'].weight_decay:g} (lr, weight decay: "
                    f"{'VideoMAE' if optimizer == 'adamw_vit' else 'the paper'}'s fine-tuning setting)"]
    assert (seen["ft"].optimizer, seen["ft"].lr) == (optimizer, lr)
    assert type(seen["opt"]).__name__ == ("ScaledAdamW" if optimizer == "adamw_vit" else "LARS")
    assert {g["lr"] for g in seen["opt"].param_groups} == {lr}  # the schedule sets each group's lr from here


def test_a_set_optimizer_is_said_to_be_set(tmp_path, capsys):
    from test_features import eval_cfg

    from moquad.eval.finetune import _optimizer

    cfg = eval_cfg(tmp_path, "", tmp_path, finetune={"init": "random", "backbone": "swin3d_t", "optimizer": "sgd"})
    cfg, line = _optimizer(cfg, None)
    assert line == ("finetune: optimizer sgd (set; the swin3d_t backbone's default is adamw_vit), lr 0.08, weight "
                    "decay 0.0001 (lr, weight decay: the paper's fine-tuning setting)")
