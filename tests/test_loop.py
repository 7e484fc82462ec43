"""The training loop on a fake deterministic loader (contract format): outputs, Algorithm 1 stages,
and exact resume after ``kill -9``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from moquad.config import LoaderConfig, PretrainConfig
from moquad.train import loop
from moquad.train.checkpoint import load, load_model
from moquad.train.log import read_log
from moquad.train.plot import plot_run

VIEW_NAMES = {
    "moquad": ("anchor", "ad_pos", "intra_neg", "ad_intra_neg"),
    "appearance": ("anchor", "pos"),
    "simclr": ("anchor", "pos"),
}


def fake_loader(data_dir, cfg, *, split="train", batch_size, epoch=0, rank=0, world_size=1, num_batches=None):
    """Random uint8 views, deterministic per (seed, epoch, rank, batch) like the real loader."""
    names = VIEW_NAMES[cfg.mode]
    for i in range(num_batches):
        g = torch.Generator().manual_seed(((cfg.seed * 1000 + epoch) * 100 + rank) * 1000 + i)
        views = torch.randint(
            0,
            256,
            (batch_size, len(names), 3, cfg.frames, cfg.size, cfg.size),
            dtype=torch.uint8,
            generator=g,
        )
        yield {
            "views": views,
            "view_names": names,
            "video_id": [f"v{i}_{b}" for b in range(batch_size)],
            "label": torch.zeros(batch_size, dtype=torch.int64),
            "lam": torch.zeros(batch_size, len(names)),
        }


def patch_normalize(module) -> None:
    """Use a stand-in for moquad.data.augment.normalize until the data package provides it."""
    if importlib.util.find_spec("moquad.data.augment") is None:

        def normalize(x, device):
            return (x.to(device).float() / 255 - 0.45) / 0.225

        module._normalize = normalize


def make_cfg(out, **kw) -> PretrainConfig:
    base = dict(
        data="unused",
        out=str(out),
        backbone="tiny",
        proj_dim=16,
        proj_hidden=32,
        epochs=3,
        batch_size=4,
        steps_per_epoch=4,
        lr_warmup_epochs=0.5,
        warmup_ratio=0.3,
        hard_beta=0.1,
        ckpt_every=3,
        device="cpu",
        loader=LoaderConfig(frames=4, size=32),
    )
    base.update(kw)
    return PretrainConfig(**base)


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    patch_normalize(loop)


def test_pretrain_outputs_and_stages(tmp_path):
    cfg = make_cfg(tmp_path / "run", epochs=2, steps_per_epoch=None, warmup_ratio=0.5)
    path = loop.pretrain(cfg, loader_fn=fake_loader, batches_fn=lambda d, s, b: 2, keep_every_epochs=1)
    run = tmp_path / "run"
    assert path == run / "checkpoints" / "last.pt"
    assert (run / "config.yaml").is_file() and any((run / "tb").iterdir())
    assert (run / "checkpoints" / "step-2.pt").is_file()
    recs = read_log(run / "log.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert [r["mode"] for r in recs] == ["appearance"] * 2 + ["moquad"] * 2
    for r in recs:
        assert set(r) >= {"loss", "lr", "clips_per_s", "data_wait", "rank_ad_pos", "rank_intra_neg", "epoch"}
        assert 0.0 <= r["data_wait"] <= 1.0 and r["loss"] > 0
    assert recs[0]["rank_intra_neg"] is None and recs[-1]["rank_intra_neg"] >= 1
    assert recs[0]["lr"] == 0.0 and recs[1]["lr"] == pytest.approx(3.2 * 4 / 256)  # 1 warm-up step

    model, ckpt = load_model(path)
    assert (ckpt["step"], ckpt["epoch"]) == (4, 2)
    assert ckpt["config"]["backbone"] == "tiny" and ckpt["moquad_version"]
    assert set(ckpt) >= {"model", "optimizer", "seeds", "git"}
    assert model.backbone(torch.randn(1, 3, 4, 32, 32)).shape == (1, 64)
    png = plot_run(run)
    assert png.is_file() and png.stat().st_size > 1000

    with pytest.raises(ValueError, match="--resume"):
        loop.pretrain(cfg, loader_fn=fake_loader, batches_fn=lambda d, s, b: 2)
    with pytest.raises(ValueError, match="epochs"):
        loop.pretrain(
            make_cfg(run, epochs=3, steps_per_epoch=2, warmup_ratio=0.5, resume=True), loader_fn=fake_loader
        )
    # resuming a finished run is a no-op that returns the same checkpoint
    assert (
        loop.pretrain(
            cfg.__class__(**{**cfg.__dict__, "resume": True}),
            loader_fn=fake_loader,
            batches_fn=lambda d, s, b: 2,
        )
        == path
    )
    assert load(path)["step"] == 4


def test_simclr_and_short_loader(tmp_path):
    cfg = make_cfg(tmp_path / "s", method="simclr", epochs=1, steps_per_epoch=2)
    loop.pretrain(cfg, loader_fn=fake_loader, tensorboard=False)
    assert [r["mode"] for r in read_log(tmp_path / "s" / "log.jsonl")] == ["simclr", "simclr"]

    def short(*a, num_batches=None, **kw):
        return fake_loader(*a, num_batches=1, **kw)

    with pytest.raises(ValueError, match="only 1 of 2"):
        loop.pretrain(
            make_cfg(tmp_path / "t", epochs=1, steps_per_epoch=2), loader_fn=short, tensorboard=False
        )
    with pytest.raises(ValueError, match="positive multiple|batch_size must be >= 1"):
        loop.pretrain(make_cfg(tmp_path / "u", batch_size=0), loader_fn=fake_loader)


SCRIPT = """
import os, signal, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_loop import fake_loader, make_cfg, patch_normalize
from moquad.train import loop
patch_normalize(loop)
out, kill_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def loader(*a, **kw):
    for i, batch in enumerate(fake_loader(*a, **kw)):
        if kw["epoch"] * 4 + i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch
loop.pretrain(make_cfg(out, resume=resume), loader_fn=loader, tensorboard=False, progress=False)
"""


def test_kill9_and_resume_matches_uninterrupted(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(tests=str(Path(__file__).parent))))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}

    def run(out, kill_at, resume):
        return subprocess.run(
            [sys.executable, str(script), str(out), str(kill_at), resume],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    full = run(tmp_path / "full", -1, "0")
    assert full.returncode == 0, full.stderr
    killed = run(tmp_path / "part", 7, "0")  # SIGKILL while fetching step 8's batch (epoch 1)
    assert killed.returncode == -9
    ckpt = load(tmp_path / "part" / "checkpoints" / "last.pt")
    assert (ckpt["step"], ckpt["epoch"]) == (6, 1)  # mid-epoch checkpoint (ckpt_every=3)
    resumed = run(tmp_path / "part", -1, "1")
    assert resumed.returncode == 0, resumed.stderr

    a = read_log(tmp_path / "full" / "log.jsonl")
    b = read_log(tmp_path / "part" / "log.jsonl")
    assert [r["step"] for r in b] == list(range(1, 13))  # the redone step 7 is logged once
    assert [r["mode"] for r in b] == [r["mode"] for r in a]
    assert b[-1]["loss"] == pytest.approx(a[-1]["loss"], rel=1e-6, abs=1e-7)
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-6, abs=1e-7)
    sa = load(tmp_path / "full" / "checkpoints" / "last.pt")["model"]
    sb = load(tmp_path / "part" / "checkpoints" / "last.pt")["model"]
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], rtol=1e-6, atol=1e-7)
    assert json.loads((tmp_path / "part" / "log.jsonl").read_text().splitlines()[-1])["step"] == 12


def test_real_shards_end_to_end_and_resume(synth_root, tmp_path):
    """synth -> preprocess -> pretrain with the real loader; an interrupted run resumes to the same losses."""
    from moquad.config import PreprocessConfig
    from moquad.preprocess.run import preprocess

    data = tmp_path / "shards"
    preprocess(
        PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(data), short_side=32, workers=1),
        quiet=True,
    )
    kw = dict(
        data=str(data),
        steps_per_epoch=None,
        epochs=2,
        warmup_ratio=0.5,
        ckpt_every=1,
        loader=LoaderConfig(frames=4, size=32, workers=0, shuffle_buffer=4, donor_pool=8),
    )
    loop.pretrain(make_cfg(tmp_path / "full", **kw), tensorboard=False, progress=False)
    full = read_log(tmp_path / "full" / "log.jsonl")
    spe = len(full) // 2
    assert spe >= 2 and [r["mode"] for r in full] == ["appearance"] * spe + ["moquad"] * spe
    assert all(r["loss"] > 0 for r in full) and full[-1]["rank_intra_neg"] >= 1

    from moquad.data.pipeline import make_loader

    class Stop(Exception):
        pass

    def interrupted(*a, **k):
        for i, batch in enumerate(make_loader(*a, **k)):
            if k["epoch"] == 1 and i == 1:
                raise Stop
            yield batch

    with pytest.raises(Stop):
        loop.pretrain(
            make_cfg(tmp_path / "part", **kw), loader_fn=interrupted, tensorboard=False, progress=False
        )
    assert load(tmp_path / "part" / "checkpoints" / "last.pt")["step"] == spe + 1
    loop.pretrain(make_cfg(tmp_path / "part", resume=True, **kw), tensorboard=False, progress=False)
    part = read_log(tmp_path / "part" / "log.jsonl")
    assert [r["loss"] for r in part] == pytest.approx([r["loss"] for r in full], rel=1e-5)


def test_resume_refuses_changed_loader(tmp_path):
    cfg = make_cfg(tmp_path / "r", epochs=1, steps_per_epoch=1)
    loop.pretrain(cfg, loader_fn=fake_loader, tensorboard=False, progress=False)
    changed = make_cfg(
        tmp_path / "r",
        epochs=1,
        steps_per_epoch=1,
        resume=True,
        loader=LoaderConfig(frames=8, size=32, workers=5),
    )
    with pytest.raises(ValueError, match=r"loader.frames: 4 -> 8"):
        loop.pretrain(changed, loader_fn=fake_loader, tensorboard=False, progress=False)
