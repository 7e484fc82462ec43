"""The training loop on a fake deterministic loader (contract format): outputs, Algorithm 1 stages,
and exact resume after ``kill -9``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from moquad.config import LoaderConfig, PretrainConfig
from moquad.errors import command_flags
from moquad.train import loop
from moquad.train.checkpoint import load, load_model
from moquad.train.log import read_log
from moquad.train.methods import METHODS
from moquad.train.plot import plot_run


def fake_loader(data_dir, cfg, *, split="train", batch_size, epoch=0, rank=0, world_size=1, start=0,
                num_batches=None, pin_memory=False, recycle=None, views=None):
    """Random uint8 views of the plan ``views``, deterministic per (seed, epoch, rank, batch) like the real loader."""
    names, roles = views.names, views.roles
    for i in range(start, num_batches):
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
            "roles": roles,
            "video_id": [f"v{i}_{b}" for b in range(batch_size)],
            "label": torch.zeros(batch_size, dtype=torch.int64),
            "lam": torch.zeros(batch_size, len(names)),
        }


def fake_plan(cfg, info):
    """The data plan of a run on fake_loader (no shards): ``cfg.steps_per_epoch``, no checksum, no report, no data."""
    return cfg.steps_per_epoch, None, lambda: None, None


def train(cfg, loader=None, **kw):
    """``loop.pretrain`` with the trainer's loader replaced by ``loader`` (default fake_loader); a run
    on ``data="unused"`` (make_cfg's default) also skips the data plan."""
    plan = fake_plan if cfg.data == "unused" else loop._data_plan
    with mock.patch.object(loop, "make_loader", loader or fake_loader), mock.patch.object(loop, "_data_plan", plan):
        return loop.pretrain(cfg, **kw)


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
        log_every=1,
        device="cpu",
        loader=LoaderConfig(frames=4, size=32),
    )
    base.update(kw)
    return PretrainConfig(**base)


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_pretrain_outputs_and_stages(tmp_path):
    cfg = make_cfg(tmp_path / "run", epochs=2, steps_per_epoch=2, warmup_ratio=0.5)
    path = train(cfg, fake_loader)
    run = tmp_path / "run"
    assert path == run / "checkpoints" / "last.pt"
    assert (run / "config.yaml").is_file() and any((run / "tb").iterdir())
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"]  # one file, rewritten in place
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
        train(cfg, fake_loader)
    with pytest.raises(ValueError, match="epochs"):
        train(
            make_cfg(run, epochs=3, steps_per_epoch=2, warmup_ratio=0.5, resume=True), fake_loader
        )
    # resuming a finished run is a no-op that returns the same checkpoint
    assert (
        train(
            cfg.__class__(**{**cfg.__dict__, "resume": True}), fake_loader,
        )
        == path
    )
    assert load(path)["step"] == 4


def test_simclr_ladder_base_classic_and_short_loader(tmp_path):
    cfg = make_cfg(tmp_path / "s", method="simclr_classic", epochs=1, steps_per_epoch=2)
    train(cfg, fake_loader, tensorboard=False)
    assert [r["mode"] for r in read_log(tmp_path / "s" / "log.jsonl")] == ["pair", "pair"]
    seen = []

    def spy(data, lcfg, views=None, **kw):
        seen.append(views.names)
        return fake_loader(data, lcfg, views=views, **kw)

    train(make_cfg(tmp_path / "b", method="simclr", epochs=2, steps_per_epoch=1, warmup_ratio=0.5), spy, tensorboard=False)
    assert seen == [("clip_n", "clip_m"), ("anchor", "pos")]

    def short(*a, num_batches=None, **kw):
        return fake_loader(*a, num_batches=1, **kw)

    with pytest.raises(ValueError, match="only 1 of 2"):
        train(
            make_cfg(tmp_path / "t", epochs=1, steps_per_epoch=2), short, tensorboard=False
        )
    with pytest.raises(ValueError, match="positive multiple|batch_size must be >= 1"):
        train(make_cfg(tmp_path / "u", batch_size=0), fake_loader)


SCRIPT = """
import os, signal, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_loop import fake_loader, make_cfg, train
from moquad.train import loop
out, kill_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def loader(*a, **kw):
    for i, batch in enumerate(fake_loader(*a, **kw)):
        if kw["epoch"] * 4 + kw["start"] + i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch
train(make_cfg(out, resume=resume), loader, tensorboard=False, progress=False)
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
        loader=LoaderConfig(frames=4, size=32, workers=0),
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
        train(
            make_cfg(tmp_path / "part", **kw), interrupted, tensorboard=False, progress=False
        )
    assert load(tmp_path / "part" / "checkpoints" / "last.pt")["step"] == spe + 1
    loop.pretrain(make_cfg(tmp_path / "part", resume=True, **kw), tensorboard=False, progress=False)
    part = read_log(tmp_path / "part" / "log.jsonl")
    assert [r["loss"] for r in part] == pytest.approx([r["loss"] for r in full], rel=1e-5)


def test_resume_refuses_changed_loader(tmp_path):
    cfg = make_cfg(tmp_path / "r", epochs=1, steps_per_epoch=1)
    train(cfg, fake_loader, tensorboard=False, progress=False)
    changed = make_cfg(
        tmp_path / "r",
        epochs=1,
        steps_per_epoch=1,
        resume=True,
        loader=LoaderConfig(frames=8, size=32, workers=5),
    )
    with pytest.raises(ValueError, match=r"loader.frames: 4 -> 8"):
        train(changed, fake_loader, tensorboard=False, progress=False)


def test_a_checkpoint_older_than_a_setting_resumes_with_the_old_behaviour(tmp_path):
    """A config saved before ``loader.scaled_decode`` existed is compared as the full decode it ran with: the
    default (True) is refused with the flag that continues the run, and that flag resumes it."""
    from dataclasses import asdict

    from moquad.train.checkpoint import check_resume

    saved = asdict(PretrainConfig())
    del saved["loader"]["scaled_decode"]
    now = asdict(PretrainConfig())
    with pytest.raises(ValueError, match=re.escape("loader.scaled_decode: False -> True); resume with --set "
                                                   "loader.scaled_decode=false or a new --out")):
        check_resume(saved, now, tmp_path / "last.pt")
    now["loader"]["scaled_decode"] = False
    check_resume(saved, now, tmp_path / "last.pt")
    saved["loader"]["scaled_decode"] = True  # written by this version: compared as it is
    with pytest.raises(ValueError, match="loader.scaled_decode: True -> False"):
        check_resume(saved, now, tmp_path / "last.pt")


def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """DINO's guard: the first non-finite loss stops the run; the checkpoint before it is left as it was."""
    from moquad.errors import MoquadError

    cfg = make_cfg(tmp_path / "n", epochs=2, steps_per_epoch=3, warmup_ratio=0.0, ckpt_every=2)
    real = loop.forward_loss

    def poisoned(model, views, roles, loss_fn, **kw):
        loss, stats = real(model, views, roles, loss_fn, **kw)
        poisoned.calls += 1
        return (loss * float("nan") if poisoned.calls == 4 else loss), stats

    poisoned.calls = 0
    monkeypatch.setattr(loop, "forward_loss", poisoned)
    with pytest.raises(MoquadError, match=r"loss is nan at step 4 \(lr [0-9.e-]+\); last good checkpoint: .*last.pt"):
        train(cfg, fake_loader, tensorboard=False, progress=False)
    ckpt = load(tmp_path / "n" / "checkpoints" / "last.pt")
    assert ckpt["step"] == 3  # the end of epoch 0, written before the bad step; nothing after it
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_log_steps_are_the_only_sync_points(tmp_path, monkeypatch):
    """Values logged every 3 steps are the means over those steps (nothing is read per step)."""
    cfg = make_cfg(tmp_path / "s", epochs=1, steps_per_epoch=6, log_every=3, warmup_ratio=0.0)
    train(cfg, fake_loader, tensorboard=False, progress=False)
    recs = read_log(tmp_path / "s" / "log.jsonl")
    assert [r["step"] for r in recs] == [3, 6] and all(r["steps"] == 3 for r in recs)
    every = make_cfg(tmp_path / "e", epochs=1, steps_per_epoch=6, log_every=1, warmup_ratio=0.0)
    train(every, fake_loader, tensorboard=False, progress=False)
    losses = [r["loss"] for r in read_log(tmp_path / "e" / "log.jsonl")]
    assert recs[0]["loss"] == pytest.approx(sum(losses[:3]) / 3, rel=1e-5)
    assert recs[1]["loss"] == pytest.approx(sum(losses[3:]) / 3, rel=1e-5)


@pytest.fixture(scope="module")
def coded_shards(tmp_path_factory):
    from video_fixtures import coded_dataset

    return coded_dataset(tmp_path_factory.mktemp("coded"), num_videos=16, num_frames=20, videos_per_shard=4)


def _real_cfg(out, data, **kw):
    return make_cfg(out, data=str(data), steps_per_epoch=None, epochs=2, warmup_ratio=0.0,
                    loader=LoaderConfig(frames=4, size=32, workers=0, **kw))


def test_a_damaged_sample_is_skipped_logged_and_the_run_finishes(coded_shards, tmp_path):
    import shutil

    from test_pipeline import _damage

    data = tmp_path / "data"
    shutil.copytree(coded_shards, data)
    _damage(data, "v06")
    # the defaults: 1 bad video of 16 is 1/16 > max_bad_fraction (1 %) but not > max_bad_count (10): the run goes on
    loop.pretrain(_real_cfg(tmp_path / "r", data), tensorboard=False, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "r" / "bad_samples.jsonl").read_text().splitlines()]
    assert {x["video_id"] for x in lines} == {"v06"} and all(x["reason"] == "checksum mismatch" for x in lines)
    assert load(tmp_path / "r" / "checkpoints" / "last.pt")["step"] == 8  # every step ran, batches stayed full
    recs = read_log(tmp_path / "r" / "log.jsonl")
    assert recs[-1]["bad_samples"] == sum(x["epoch"] == 1 for x in lines)
    from moquad import config as C
    from moquad import settings
    from moquad.errors import MoquadError

    with pytest.raises(MoquadError, match=r"unreadable, more than loader.max_bad_fraction=0.01 of them and more "
                                          r"than loader.max_bad_count=0; ") as e:
        loop.pretrain(_real_cfg(tmp_path / "s", data, max_bad_count=0), tensorboard=False, progress=False)
    keys = re.findall(r"--set ([\w.]+)=", str(e.value)) + re.findall(r"(loader\.max_bad_\w+)=", str(e.value))
    assert keys and settings.resolve(C.PretrainConfig(), None, {}, [f"{k}=1" for k in keys])  # the named keys exist
    # the count exceeded but not the fraction: the run goes on (the defaults above: the fraction, not the count)
    loop.pretrain(_real_cfg(tmp_path / "t", data, max_bad_count=0, max_bad_fraction=0.5), tensorboard=False, progress=False)


def test_resume_deep_into_an_epoch_does_not_read_the_batches_before(coded_shards, tmp_path, monkeypatch):
    """A checkpoint at step 7 of an 8-step epoch: the resumed run reads only the last batch of the epoch."""
    from moquad.data import store

    cfg = make_cfg(tmp_path / "d", data=str(coded_shards), steps_per_epoch=None, epochs=1, batch_size=2,
                   ckpt_every=7, warmup_ratio=0.0, loader=LoaderConfig(frames=4, size=32, workers=0))
    reads = []
    payload = store.Split.payload
    monkeypatch.setattr(store.Split, "payload", lambda self, i, verify=True: reads.append(i) or payload(self, i, verify))

    class Stop(Exception):
        pass

    from moquad.data.pipeline import make_loader

    def stop_after_7(*a, **k):
        for i, b in enumerate(make_loader(*a, **k)):
            if i == 7:
                raise Stop
            yield b

    with pytest.raises(Stop):
        train(cfg, stop_after_7, tensorboard=False, progress=False)
    assert load(tmp_path / "d" / "checkpoints" / "last.pt")["step"] == 7
    reads.clear()
    loop.pretrain(dataclasses.replace(cfg, resume=True), tensorboard=False, progress=False)
    assert len(reads) == 2  # batch 8 only (2 videos), not the 14 videos of batches 1..7
    assert load(tmp_path / "d" / "checkpoints" / "last.pt")["step"] == 8


QUAD_NAMES = ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")
RUNGS = [  # the paper's Table 4, bottom up: each rung adds one part of the quadruple to the SimCLR base
    ("simclr", {}, ("anchor", "pos"), [False, False]),
    ("moquad", {"intra_neg": False, "ad_intra_neg": False}, ("anchor", "ad_pos"), [False, True]),
    ("moquad", {"ad_intra_neg": False}, ("anchor", "ad_pos", "intra_neg"), [False, True, False]),
    ("moquad", {}, QUAD_NAMES, [False, True, False, True]),
]


@pytest.mark.parametrize("method, switches, names, disturbed", RUNGS)
def test_baseline_ladder_views_and_loss(coded_shards, method, switches, names, disturbed):
    """Every rung samples clips the same way (anchor and positive at one random speed n, Intra-Negs at m) and
    uses Eq. 1's one-directional loss; only the views differ. The loss equals the element-by-element loop."""
    from test_losses import ref_quad

    from moquad.data.augment import normalize
    from moquad.data.pipeline import make_loader
    from moquad.models import build_model
    from moquad.train.losses import moquad_loss

    stage = METHODS[method].stage("moquad")
    lcfg = LoaderConfig(frames=4, size=32, workers=0, **{**switches, **stage.switches})
    batch = next(iter(make_loader(coded_shards, lcfg, batch_size=4, views=stage.views(lcfg))))
    assert batch["view_names"] == names
    assert ((batch["lam"] > 0) == torch.tensor(disturbed)).all()  # which views carry RAD
    for info in batch["info"]:
        n, m = info["dilations"]
        steps = [set(np.diff(np.asarray(i)).tolist()) for i in info["indices"]]
        assert steps[:2] == [{n}, {n}] and all(s == {m} for s in steps[2:])
    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=16, proj_hidden=32).eval()
    with torch.no_grad():
        z = model(normalize(batch["views"], "cpu").flatten(0, 1)).view(4, len(names), -1)
    got, _ = moquad_loss(z, batch["roles"], tau=0.1, hard_beta=0.01, hard_alpha=1.5, video=batch["index"])
    want, _, _ = ref_quad(z.double(), names, 0.1, 0.01, 1.5, range(4))
    assert float(got) == pytest.approx(float(want), rel=1e-5)



@pytest.mark.parametrize("videos, batch, epochs, want", [
    # already on train/cpu_demo.yaml (batch 16, 60 epochs) with a small split: no advice to use what it uses
    (20, 16, 60, None),
    (13, 13, 20, "only 20 optimizer steps (13 videos in batches of 13: 1 per epoch, 20 epochs); the split is small "
                 "for batch 13; for at least 50 steps use --epochs 50, or --batch-size 4 (3 steps per epoch)"),
    (13, 8, 6, "only 6 optimizer steps (13 videos in batches of 8: 1 per epoch, 6 epochs); the split is small for "
               "batch 8; for at least 50 steps use --epochs 50, or --batch-size 4 (3 steps per epoch) with --epochs 17"),
    (300, 256, 5, "only 5 optimizer steps (300 videos in batches of 256: 1 per epoch, 5 epochs); the split is small "
                  "for batch 256; for at least 50 steps use --epochs 50, or --batch-size 16 (18 steps per epoch)"),
    (9, 4, 3, "only 6 optimizer steps (9 videos in batches of 4: 2 per epoch, 3 epochs); the split is small for "
              "batch 4; for at least 50 steps use --epochs 25"),
])
def test_small_run_advice_fits_the_settings(videos, batch, epochs, want):
    """The warning's advice starts from the run's own batch and epochs (never 'batch 16, 60 epochs' to a user
    already there) and each change it names reaches MIN_STEPS."""
    if want is None:
        assert videos // batch * epochs >= loop.MIN_STEPS
        return
    with command_flags({"epochs": "--epochs", "batch_size": "--batch-size"}):  # as `moquad pretrain` words it
        assert loop.small_run_advice(videos, batch, epochs) == want
    # from Python: the config fields
    assert loop.small_run_advice(videos, batch, epochs) == re.sub(r"--(epochs|batch-size) (\d+)",
                                                                  lambda m: f"{m[1].replace('-', '_')}={m[2]}", want)
    for b, e in re.findall(r"--batch-size (\d+) \(\d+ steps per epoch\)(?: with --epochs (\d+))?", want):
        assert videos // int(b) * int(e or epochs) >= loop.MIN_STEPS


@pytest.mark.parametrize("unfit, said", [({1: 0, 4: 0}, False), ({1: 0, 4: 3}, True)])
def test_the_short_video_line_is_said_only_when_some_video_is_short(capsys, unfit, said):
    """Start-up names the videos too short per dilation only when there are some ("dilation 1: 0, dilation 4: 0"
    was printed on every run)."""
    cfg = PretrainConfig(epochs=60, batch_size=16, loader=LoaderConfig(frames=8, dilations=(1, 4)))
    loop._report(cfg, 280, 17, unfit)
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("pretrain: 280 videos in split 'train', global batch 16: 17 steps per epoch, 1020 steps")
    assert ("videos too short for a 8-frame clip (dilation 1: 0, dilation 4: 3)" in out) is said
    assert ("too short" in out) is said


@pytest.mark.parametrize("warmup, said", [(3, True), (1, False), (0, False)])
def test_a_warm_up_as_long_as_the_run_is_said(capsys, warmup, said):
    """--set epochs=1 over a recipe with a 3-epoch lr warm-up trained at lr 0 and said nothing."""
    cfg = PretrainConfig(epochs=3 if warmup == 3 else 2, batch_size=16, lr=16.0, lr_warmup_epochs=warmup)
    loop._report(cfg, 280, 17, {})
    out = " ".join(capsys.readouterr().out.split())
    assert ("the learning-rate warm-up (3 epochs) is as long as the run (3): the lr never reaches 16.0; pass "
            "lr_warmup_epochs='N' below 3 (0: none)" in out) is said
    assert ("warm-up" in out) is said
