"""moquad export: torchvision round trip (features equal moquad's), safetensors, the model card, errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import cli_child as clirun
import pytest
import torch
import torchvision.models.video as tvv
from safetensors.torch import load_file
from video_fixtures import make_checkpoint

from moquad.data.store import manifest_checksum
from moquad.errors import MoquadError
from moquad.export import TORCHVISION, export
from moquad.models import build_backbone
from moquad.preprocess.manifest import read_manifest
from moquad.train import checkpoint

# moquad's backbone and the torchvision model run the same modules on the same weights: in practice the
# features are bit-identical; the tolerance only allows for a different kernel choice between the two calls
ATOL, RTOL = 1e-6, 1e-5


def _checkpoint(path: Path, backbone: str, data: str = "", seed: int = 0) -> Path:
    return make_checkpoint(path, seed=seed, backbone=backbone, data=data)


def _moquad_features(ckpt: Path, x: torch.Tensor) -> torch.Tensor:
    model, _ = checkpoint.load_model(ckpt)
    with torch.no_grad():
        return model.backbone.eval()(x)


def _torchvision(arch: str, headless: bool) -> torch.nn.Module:
    model = getattr(tvv, arch)()
    if headless and arch == "s3d":
        model.classifier, model.avgpool = torch.nn.Identity(), torch.nn.AdaptiveAvgPool3d(1)
    elif headless:
        model.fc = torch.nn.Identity()
    return model


@pytest.mark.parametrize("arch", ["r3d_18", "r2plus1d_18", "s3d"])
def test_torchvision_round_trip_features_equal(tmp_path, arch):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", arch)
    weights, card = export(ckpt, "torchvision", tmp_path / f"{arch}.pt")
    sd = torch.load(weights, weights_only=True)
    # the unmodified torchvision model: exactly the classifier head is missing, nothing unexpected
    missing, unexpected = _torchvision(arch, headless=False).load_state_dict(sd, strict=False)
    assert sorted(missing) == sorted(TORCHVISION[arch].head) and unexpected == []
    model = _torchvision(arch, headless=True)
    model.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 8, 48, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model.eval()(x)
    want = _moquad_features(ckpt, x)
    assert got.shape == want.shape == (2, json.loads(card.read_text())["feature_dim"])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert want.abs().max() > 1e-3  # not a trivially zero feature


@pytest.mark.parametrize("arch", ["tiny", "r3d_50", "r3d_18"])
def test_safetensors_loads_as_the_card_says(tmp_path, arch):
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", arch)
    weights, card_path = export(ckpt, "safetensors", tmp_path / "model.safetensors")
    card = json.loads(card_path.read_text())
    assert card["architecture"] == arch and card["format"] == "safetensors" and "load_file" in card["load"]
    if arch in TORCHVISION:
        model = _torchvision(arch, headless=True)
    else:
        model, dim = build_backbone(arch)
        assert card["feature_dim"] == dim and "build_backbone" in card["load"]
    model.load_state_dict(load_file(weights), strict=True)
    x = torch.randn(2, 3, 8, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model.eval()(x)
    torch.testing.assert_close(got, _moquad_features(ckpt, x), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("arch", ["r3d_18", "s3d"])
def test_card_load_line_runs_as_printed(tmp_path, arch, monkeypatch):
    """The card's `load` line (built from BACKBONES' torchvision names) loads the export strictly, as printed."""
    import torchvision

    ckpt = _checkpoint(tmp_path / "last.pt", arch)
    _, card = export(ckpt, "torchvision", tmp_path / "w.pt")
    monkeypatch.chdir(tmp_path)
    scope = {"torch": torch, "torchvision": torchvision}
    exec(json.loads(card.read_text())["load"], scope)  # noqa: S102 - the line a user pastes
    x = torch.randn(1, 3, 8, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(scope["model"].eval()(x), _moquad_features(ckpt, x), atol=ATOL, rtol=RTOL)


def test_cli_export_model_card_with_data_and_eval_results(tmp_path):
    from test_features import eval_cfg, make_tiny_dataset

    from moquad.eval.retrieve import retrieve

    data = make_tiny_dataset(tmp_path / "data", {"train": 9, "test": 4}, frames=8)
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", "tiny", data=str(data))
    res = retrieve(eval_cfg(data, ckpt, None, num_clips=1))  # writes RUN/eval/retrieval.json
    other = tmp_path / "run" / "eval" / "linear_fast.json"  # a result of ANOTHER checkpoint at this path
    other.write_text(json.dumps({"task": "linear", "top1": 0.5, "checkpoint": {"sha256": "0" * 64}}))
    out = tmp_path / "export" / "tiny.safetensors"
    run = clirun.python("-m", "moquad.cli", "export", str(ckpt), "--format", "safetensors",
                          "--out", str(out))
    assert run.returncode == 0, run.stderr
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["checkpoint"]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert card["file_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert card["pretrain_config"] == checkpoint.load(ckpt)["config"]
    assert card["data"]["manifest_checksum"] == manifest_checksum(read_manifest(data, "train"))
    assert card["data"]["videos"] == 9
    got = card["eval"]["results"]["retrieval"]
    assert {k: got[k] for k in ("task", "top1", "top5", "knn_top1", "knn_top5")} == {
        "task": "retrieval", **{k: res[k] for k in ("top1", "top5", "knn_top1", "knn_top5")}}
    assert got["protocol"]["clip"]["frames"] == 4 and got["protocol"]["views"] == {"clips": 1, "crops": 1,
                                                                                  "per_video": 1}
    assert got["protocol"]["checkpoint_step"] == 7 and got["protocol"]["splits"] == {"train": "train", "test": "test"}
    assert [s["file"] for s in card["eval"]["skipped"]] == ["linear_fast.json"]
    assert "another checkpoint" in card["eval"]["skipped"][0]["reason"]
    assert "skipped " in run.stdout and "linear_fast.json (not in the card): made from another checkpoint" in run.stdout
    assert load_file(out).keys() == build_backbone("tiny")[0].state_dict().keys()


def test_card_without_readable_data(tmp_path):
    ckpt = _checkpoint(tmp_path / "last.pt", "tiny", data=str(tmp_path / "moved-away"))
    _, card = export(ckpt, "safetensors", tmp_path / "m.safetensors")
    data = json.loads(card.read_text())["data"]
    assert data["manifest_checksum"] is None and "not readable" in data["reason"]
    assert json.loads(card.read_text())["eval"] == {"results": {}}


@pytest.mark.parametrize("case, message", [
    ("not-moquad", "is not a moquad checkpoint (a plain state dict"),
    ("tiny-torchvision", "--format safetensors"),
])
def test_cli_errors_one_line_nothing_written(tmp_path, case, message):
    ckpt = tmp_path / "last.pt"
    if case == "not-moquad":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    else:
        _checkpoint(ckpt, "tiny")
    out = tmp_path / "out" / "m.pt"
    run = clirun.python("-m", "moquad.cli", "export", str(ckpt), "--out", str(out))
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt, name, message", [
    ("onnx", "m.pt", "unknown format 'onnx'"),
    ("torchvision", "m.json", "clash with its model card"),
])
def test_bad_options(tmp_path, fmt, name, message):
    ckpt = _checkpoint(tmp_path / "last.pt", "r3d_18")
    with pytest.raises(ValueError, match=message):
        export(ckpt, fmt, tmp_path / "out" / name)
    with pytest.raises(FileNotFoundError, match="not found"):
        export(tmp_path / "missing.pt", "torchvision", tmp_path / "out" / "m.pt")
    assert not (tmp_path / "out").exists()


def test_disk_full_leaves_nothing(tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "last.pt", "tiny")

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(MoquadError, match="no space left"):
        export(ckpt, "safetensors", tmp_path / "out" / "m.safetensors")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("arch", TORCHVISION)
def test_the_token_grid_rule_belongs_to_its_row(arch):
    """The card's grid line comes from the row's own rule (MViT's patch strides), only for a row that has one and at
    a clip other than the row's native clip; Swin, whose native clip is 32 x 224, runs at any clip as built."""
    from moquad.export import _clip_grid
    from moquad.models import BACKBONES

    row = BACKBONES[arch]
    assert _clip_grid(arch, *row.clip) == ""
    line = _clip_grid(arch, 4, 32)
    if row.grid is None:
        assert line == ""
    else:
        assert row.grid.of(4, 32) == (2, 8, 8) and row.grid.of(16, 224) == (8, 56, 56)
        assert "model.pos_encoding.temporal_size = 2; model.pos_encoding.spatial_size = (8, 8)" in line
    assert (row.grid is not None) == (arch == "mvit_v2_s")


def test_help_has_example():
    run = clirun.python("-m", "moquad.cli", "export", "--help")
    assert run.returncode == 0 and "Example" in run.stdout and "strict" not in run.stderr
