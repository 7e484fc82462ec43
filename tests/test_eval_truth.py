"""Evaluation tests what was trained, and its results cannot go stale.

A tiny checkpoint pre-trained at 8 frames x 32 px (dilations 1 and 4) is evaluated without clip settings: every
protocol runs at 8 x 32 and its result says so; an explicit setting that differs prints ONE warning line naming
both; ``--json`` writes a copy beside the RUN/eval result and nothing else; the export card carries only results
of THAT checkpoint, each with its protocol.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import cli_child as clirun
import numpy as np
import pytest
from test_features import make_tiny_dataset
from torch import nn
from video_fixtures import make_checkpoint

from moquad.config import EvalConfig
from moquad.eval.clips import pretrain_clip
from moquad.eval.common import with_clip
from moquad.eval.features import read_features
from moquad.eval.protocols import run
from moquad.export import export

TRAINED = {"frames": 8, "size": 32, "dilations": (1, 4)}  # the pre-training clip of the checkpoint below


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(data folder, RUN/checkpoints/last.pt of a tiny encoder pre-trained at 8 x 32)."""
    root = tmp_path_factory.mktemp("truth")
    data = make_tiny_dataset(root / "data", {"train": 9, "test": 6}, frames=20)
    return data, make_checkpoint(root / "run" / "checkpoints" / "last.pt", data=str(data), loader=TRAINED)


def _cfg(data: Path, ckpt: Path, **kw) -> EvalConfig:
    """No clip settings: the checkpoint's (only the test views and the machine are set)."""
    base = dict(data=str(data), checkpoint=str(ckpt), num_clips=2, batch_size=8, workers=0, ks=(1, 5),
                device="cpu", linear={"epochs": 2}, finetune={"epochs": 1, "batch_size": 4})
    return EvalConfig(**{**base, **kw})


def _cli(*args) -> subprocess.CompletedProcess:
    return clirun.python("-m", "moquad.cli", *map(str, args))


def test_pretrain_clip_is_read_from_the_config():
    """The ONE reader of the training clip: settings, the evaluation dilation rule, fallbacks."""
    clip = pretrain_clip({"loader": {"frames": 8, "size": 32, "dilations": [4, 1]}, "model_input": "diff"})
    assert (clip.frames, clip.size, clip.dilations, clip.model_input) == (8, 32, (1, 4), "diff")
    # the paper's evaluation dilation 2, kept inside the range the clips were drawn over
    dil = {d: pretrain_clip({"loader": {"dilations": d}}).dilation for d in ((1, 2, 4), (1, 4), (4, 8), (1,))}
    assert dil == {(1, 2, 4): 2, (1, 4): 2, (4, 8): 4, (1,): 1}
    classic = pretrain_clip({"method": "simclr_classic", "loader": {"dilations": [1, 2, 4], "simclr_dilation": 3}})
    assert classic.dilations == (3,) and classic.dilation == 3
    none = pretrain_clip(None)  # no checkpoint: the paper's 16 x 224, rgb
    assert (none.frames, none.size, none.dilation, none.model_input) == (16, 224, 2, "rgb")


def test_motion_and_export_read_the_same_clip(trained, tmp_path):
    from moquad.eval.encoders import native_clip
    from moquad.eval.encoders import wrap as Encoder
    from moquad.eval.motion import geometry

    data, ckpt = trained
    info = {"loader": dict(TRAINED), "model_input": "rgb"}
    assert geometry([Encoder("a", nn.Identity(), {}), Encoder("m", nn.Identity(), info)], None, None) == (8, 32)
    assert geometry([Encoder("m", nn.Identity(), info)], None, 48) == (8, 48)
    tv = {arch: Encoder(arch, nn.Identity(), {"clip": native_clip(arch)}) for arch in ("r3d_18", "mvit_v2_s")}
    assert geometry([tv["r3d_18"]], None, None) == (16, 112)  # torchvision's Kinetics weights: each row's clip
    assert geometry([tv["mvit_v2_s"]], None, None) == (16, 224)
    assert geometry([tv["mvit_v2_s"], Encoder("m", nn.Identity(), info)], None, None) == (8, 32)  # moquad's clip first
    assert geometry([Encoder("x", nn.Identity(), {})], None, None) == (16, 224)  # nothing known: the config's default clip
    _, card = export(ckpt, "safetensors", tmp_path / "m.safetensors")
    inp = json.loads(card.read_text())["input"]
    assert (inp["pretrain_frames"], inp["pretrain_size"], inp["pretrain_dilations"]) == (8, 32, [1, 4])


def test_warning_names_both_and_who_set_it(trained, tmp_path, capsys):
    data, ckpt = trained
    assert with_clip(_cfg(data, ckpt), warn=True).frames == 8 and capsys.readouterr().err == ""
    got = with_clip(_cfg(data, ckpt, frames=16, size=224), warn=True)
    assert (got.frames, got.size, got.dilation) == (16, 224, 2)
    assert capsys.readouterr().err == ("warning: evaluating at 16x224 but the encoder was pre-trained at 8x32 "
                                       "(--frames/--size set it)\n")
    with_clip(_cfg(data, ckpt, dilation=8), warn=True)
    assert capsys.readouterr().err == ("warning: evaluating at 8x32 at dilation 8 but the encoder was pre-trained "
                                       "at 8x32 at dilation 1,4 (--dilation sets it)\n")
    with_clip(_cfg(data, ckpt, dilation=3), warn=True)  # a speed between two it was trained at
    assert capsys.readouterr().err == ""
    # a shipped recipe that differs on purpose (the paper's linear protocol: 32 frames) is named as the setter
    from moquad import settings

    cfg = settings.resolve(_cfg(data, ckpt), "eval/linear_ucf101.yaml", {"size": 48})
    with_clip(dataclasses.replace(cfg, recipe="eval/linear_ucf101.yaml"), warn=True)
    assert capsys.readouterr().err == ("warning: evaluating at 32x48 but the encoder was pre-trained at 8x32 "
                                       "(recipe eval/linear_ucf101.yaml sets frames; --size sets it)\n")


def test_cli_records_the_recipe_it_was_given(trained):
    data, ckpt = trained
    res = _cli("linear", "--data", data, "--checkpoint", ckpt, "--recipe", "eval/linear_ucf101.yaml", "--print-config")
    assert res.returncode == 0, res.stderr
    assert "recipe: eval/linear_ucf101.yaml" in res.stdout and "frames: 32" in res.stdout
    assert "size: null" in res.stdout  # left to the checkpoint


def test_motion_warns_once_per_encoder_trained_at_another_clip():
    from moquad.eval.encoders import wrap as Encoder
    from moquad.eval.motion import clip_warnings

    encoders = [Encoder("ours", nn.Identity(), {"loader": dict(TRAINED)}), Encoder("tv", nn.Identity(), {})]
    assert clip_warnings(encoders, None, None) == []
    assert clip_warnings(encoders, None, 64) == [
        "warning: evaluating at 8x64 but encoder ours was pre-trained at 8x32 (--size sets it)"]


def test_retrieve_cli_defaults_to_the_trained_clip_and_json_is_a_copy(trained, tmp_path):
    data, ckpt = trained
    run_eval = ckpt.parent.parent / "eval"
    args = ("retrieve", "--data", data, "--checkpoint", ckpt, "--num-clips", 2, "--device", "cpu",
            "--set", "workers=0", "--set", "ks=1,5")
    res = _cli(*args)
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    default = json.loads((run_eval / "retrieval.json").read_text())
    assert default["clip"] == {"frames": 8, "size": 32, "dilation": 2, "short_side": 32, "model_input": "rgb",
                               "pretrained": {"frames": 8, "size": 32, "dilations": [1, 4], "model_input": "rgb"},
                               "matches_pretraining": True}
    assert default["views"] == {"clips": 2, "crops": 1, "per_video": 2}
    assert default["checkpoint"]["step"] == 7 and len(default["checkpoint"]["sha256"]) == 64
    assert default["splits"] == {"train": "train", "test": "test"}
    assert set(default["data"]["manifests"]) == {"train", "test"}
    feats = read_features(default["features"]["test"])["metadata"]["protocol"]
    assert (feats["frames"], feats["size"], feats["dilation"]) == (8, 32, 2)  # what was computed
    table = (run_eval / "retrieval.txt").read_text()
    assert "8 frames x 32 px, dilation 2" in table and "pre-trained at 8 x 32" in table
    assert "checkpoint step" in table and "2 clips x 1 crop per video" in table

    copy = tmp_path / "copy" / "retrieval.json"
    res = _cli(*args, "--size", 48, "--json", copy)
    assert res.returncode == 0, res.stderr
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("warning")] == [
        "warning: evaluating at 8x48 but the encoder was pre-trained at 8x32 (--size sets it)"]
    written = run_eval / "retrieval.json"
    assert copy.read_bytes() == written.read_bytes()  # a copy, and RUN/eval holds the new result too
    assert sorted(p.name for p in copy.parent.iterdir()) == ["retrieval.json"]  # nothing unannounced beside it
    new = json.loads(written.read_text())
    assert new["clip"]["size"] == 48 and new["clip"]["matches_pretraining"] is False
    assert f"copy: {copy}" in res.stdout and "DIFFERENT" in (run_eval / "retrieval.txt").read_text()


def test_every_protocol_runs_at_the_trained_clip(trained, tmp_path):
    data, ckpt = trained
    out = tmp_path / "out"
    lin = run("linear", _cfg(data, ckpt, out=str(out)), fast=True, json_path=tmp_path / "lin.json")
    assert lin["clip"]["frames"] == 8 and lin["clip"]["size"] == 32 and lin["protocol"]["features"]["size"] == 32
    assert json.loads((tmp_path / "lin.json").read_text()) == json.loads((out / "linear_fast.json").read_text())
    ft = run("finetune", _cfg(data, ckpt, out=str(out), num_clips=1))
    assert (ft["clip"]["frames"], ft["clip"]["size"], ft["clip"]["dilation"]) == (8, 32, 2)
    assert "8 frames, dilation 2" in ft["protocol"]["train_clip"] and ft["checkpoint"]["step"] == 7
    path = run("extract", _cfg(data, ckpt, out=str(out)), split="test")
    meta = read_features(path)["metadata"]["protocol"]
    assert (meta["frames"], meta["size"]) == (8, 32)
    png = run("cam", _cfg(data, ckpt), video="test/v_Red_00.avi", out=str(tmp_path / "cam.png"))
    assert "8 frames" in json.loads(Path(png).with_suffix(".json").read_text())["clip"]


def _card(ckpt: Path, tmp_path: Path, name: str) -> dict:
    _, card = export(ckpt, "safetensors", tmp_path / f"{name}.safetensors")
    return json.loads(card.read_text())["eval"]


def test_export_card_never_carries_a_stale_number(trained, tmp_path):
    data, _ = trained
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", data=str(data), loader=TRAINED)
    first = run("retrieve", _cfg(data, ckpt))
    card = _card(ckpt, tmp_path, "a")
    assert card["results"]["retrieval"]["top1"] == first["top1"]
    assert card["results"]["retrieval"]["protocol"]["clip"]["size"] == 32
    # re-evaluated at another protocol, the result elsewhere (--json): the card follows the NEW result
    second = run("retrieve", _cfg(data, ckpt, size=48, num_clips=1), json_path=tmp_path / "elsewhere.json",
                 overwrite=True)
    card = _card(ckpt, tmp_path, "b")["results"]["retrieval"]
    assert card["protocol"]["clip"]["size"] == 48 and card["protocol"]["views"]["clips"] == 1
    assert card["top1"] == second["top1"] and card["knn_top1"] == second["knn_top1"]
    # a result that records no protocol (an older moquad) is not copied, even of this checkpoint
    old = json.loads((tmp_path / "run" / "eval" / "retrieval.json").read_text())
    for key in ("clip", "views"):
        old.pop(key)
    (tmp_path / "run" / "eval" / "linear_fast.json").write_text(json.dumps({**old, "task": "linear"}))
    card = _card(ckpt, tmp_path, "c")
    assert set(card["results"]) == {"retrieval"}
    assert card["skipped"] == [{"file": "linear_fast.json", "reason": "records no protocol (clip, test views): made "
                                "by an older moquad; re-run the evaluation"}]
    # the checkpoint swapped for another (same path): none of the results is its own
    make_checkpoint(ckpt, seed=1, data=str(data), loader=TRAINED)
    card = _card(ckpt, tmp_path, "d")
    assert card["results"] == {}
    assert [s["file"] for s in card["skipped"]] == ["linear_fast.json", "retrieval.json"]
    assert all("another checkpoint" in s["reason"] for s in card["skipped"])
    assert np.isfinite(first["top1"])
