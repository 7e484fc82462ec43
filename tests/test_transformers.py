"""The video transformers of the backbone table (swin3d_t, mvit_v2_s) through every stage, on the CPU at the smallest
clips that keep each test meaningful: training steps (moquad, simclr) with the ``adamw_vit`` optimizer, save /
resume, export into torchvision, CAM, feature extraction."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torchvision.models.video as tvv
from test_features import eval_cfg, make_tiny_dataset
from test_loop import fake_loader, make_cfg, train

from moquad import config as C
from moquad.config import LoaderConfig
from moquad.eval.cam import token_cam
from moquad.export import export
from moquad.models import BACKBONES, TokenMap, build_backbone, build_model
from moquad.train import checkpoint
from moquad.train.log import read_log

ARCHS = ["swin3d_t", "mvit_v2_s"]
TINY = LoaderConfig(frames=2, size=16)  # one temporal token; a 4 x 4 patch grid: the smallest clip of both


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def _checkpoint(path, arch: str, frames: int, size: int):
    """A pretrain checkpoint of a random ``arch`` model whose config says it was trained on ``frames x size``."""
    torch.manual_seed(0)
    model = build_model(arch, proj_dim=16, proj_hidden=32)
    cfg = C.to_dict(C.PretrainConfig(backbone=arch, proj_dim=16, proj_hidden=32, optimizer="adamw_vit",
                                     loader=LoaderConfig(frames=frames, size=size)))
    return checkpoint.save({"model": model.state_dict(), "optimizer": {}, "step": 1, "epoch": 0, "config": cfg,
                            "seeds": {"seed": 0}, "moquad_version": "test", "git": None}, path)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_declares_dim_and_torchvision_names(arch):
    net, dim = build_backbone(arch)
    row = BACKBONES[arch]
    assert dim == row.dim == 768 and net(torch.randn(2, 3, 2, 16, 16)).shape == (2, 768)
    sd = {k[len(row.torchvision.prefix):]: v for k, v in net.state_dict().items()}
    missing, unexpected = getattr(tvv, arch)().load_state_dict(sd, strict=False)
    assert sorted(missing) == sorted(row.torchvision.head) and unexpected == []


@pytest.mark.parametrize("arch", ARCHS)
def test_simclr_step(tmp_path, arch):
    """One step of the ladder's base (SimCLR): two views per video, a finite positive loss, a checkpoint."""
    cfg = make_cfg(tmp_path / "run", backbone=arch, method="simclr", optimizer="adamw_vit", lr=1e-3, batch_size=2,
                   epochs=1, steps_per_epoch=1, lr_warmup_epochs=0, warmup_ratio=0.0, loader=TINY)
    train(cfg, tensorboard=False, progress=False)
    (rec,) = read_log(tmp_path / "run" / "log.jsonl")
    assert rec["mode"] == "moquad" and 0 < rec["loss"] < 10 and rec["lr"] == pytest.approx(1e-3 * 2 / 256)
    assert checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["config"]["method"] == "simclr"


@pytest.mark.parametrize("arch", ARCHS)
def test_moquad_steps_save_and_resume(tmp_path, arch):
    """Two epochs of two steps with adamw_vit (appearance warm-up, then MoQuad); a run stopped after step 3 resumes
    to the same losses and weights."""
    kw = dict(backbone=arch, optimizer="adamw_vit", lr=1e-3, weight_decay=0.05, batch_size=2,
              epochs=2, steps_per_epoch=2, lr_warmup_epochs=1, warmup_ratio=0.5, ckpt_every=3, loader=TINY)
    train(make_cfg(tmp_path / "full", **kw), tensorboard=False, progress=False)
    full = read_log(tmp_path / "full" / "log.jsonl")
    assert [r["mode"] for r in full] == ["appearance"] * 2 + ["moquad"] * 2
    assert all(r["loss"] > 0 and r["loss"] == r["loss"] for r in full)
    assert [r["lr"] for r in full] == pytest.approx([0.0, 1e-3 * 2 / 256 / 2, 1e-3 * 2 / 256, 1e-3 * 2 / 256 / 2])
    ckpt = checkpoint.load(tmp_path / "full" / "checkpoints" / "last.pt")
    assert ckpt["step"] == 4 and {g["lr_scale"] for g in ckpt["optimizer"]["param_groups"]} == {1.0}

    class Stop(Exception):
        pass

    def stopped(*a, **k):
        for i, batch in enumerate(fake_loader(*a, **k)):
            if k["epoch"] == 1 and k["start"] + i == 1:
                raise Stop
            yield batch

    with pytest.raises(Stop):
        train(make_cfg(tmp_path / "part", **kw), stopped, tensorboard=False, progress=False)
    train(make_cfg(tmp_path / "part", resume=True, **kw), tensorboard=False, progress=False)
    part = read_log(tmp_path / "part" / "log.jsonl")
    assert [r["loss"] for r in part] == pytest.approx([r["loss"] for r in full], rel=1e-5)
    a, b = ckpt["model"], checkpoint.load(tmp_path / "part" / "checkpoints" / "last.pt")["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch,frames,size", [("swin3d_t", 4, 32), ("mvit_v2_s", 4, 32), ("mvit_v2_s", 16, 224)])
def test_export_loads_strictly_into_torchvision_as_the_card_says(tmp_path, arch, frames, size):
    """The card's load line, run as written, gives torchvision's model with moquad's features (MViT at a clip other
    than 16 x 224: the card sets the token grid; at 16 x 224 it sets nothing)."""
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", arch, frames, size)
    weights, card_path = export(ckpt, "torchvision", tmp_path / "w.pt")
    card = json.loads(card_path.read_text())
    assert card["feature_dim"] == 768 and card["not_exported"][:-1] == list(BACKBONES[arch].torchvision.head)
    assert ("pos_encoding" in card["load"]) == (arch == "mvit_v2_s" and (frames, size) != (16, 224))
    if (frames, size) == (16, 224):
        return  # the CPU cost of a 16 x 224 forward buys nothing more; the load line is all that differs
    scope = {"torch": torch, "torchvision": __import__("torchvision")}
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        exec(card["load"], scope)  # strict load
    finally:
        os.chdir(cwd)
    model = scope["model"].eval()
    x = torch.randn(2, 3, frames, size, size, generator=torch.Generator().manual_seed(1))
    ours, _ = checkpoint.load_model(ckpt)
    with torch.no_grad():
        got, want = model(x), ours.backbone.eval()(x)
    assert got.shape == want.shape == (2, 768)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class _OneToken(torch.nn.Module):
    """Tokens (N, C, 2, 3, 3) = the input; the 'feature' reads only token (1, 2, 0)."""

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Identity()

    def forward(self, x):
        return self.tokens(x)[:, :, 1, 2, 0] * 2.0


def test_token_cam_is_nonzero_exactly_where_the_score_has_gradient():
    x = torch.rand(1, 5, 2, 3, 3) + 0.1
    amap, info = token_cam(_OneToken(), TokenMap("tokens", lambda o: o, "test"), x, lambda f: (f.sum(), {}))
    want = torch.zeros(2, 3, 3)
    want[1, 2, 0] = 2.0 * x[0, :, 1, 2, 0].sum()  # sum_c A * dS/dA
    torch.testing.assert_close(amap, want)
    assert info["token_grid"] == [2, 3, 3] and info["positive_tokens"] == 1


def test_mvit_cam_reads_the_tokens_entering_the_last_block():
    """MViT's feature is the class token after its last block: that block's patch-token outputs get no gradient,
    its inputs (the row's TokenMap) do, so the map is nonzero."""
    net, _ = build_backbone("mvit_v2_s")
    seen = {}
    hooks = [net.get_submodule(f"net.blocks.{i}").register_forward_hook(lambda m, i, o, k=i: seen.update({k: o[0]}))
             for i in (14, 15)]
    feat = net.eval()(torch.randn(1, 3, 4, 64, 64))
    for h in hooks:
        h.remove()
    g14, g15 = torch.autograd.grad(feat.norm(), [seen[14], seen[15]])
    assert g15[:, 1:].abs().max() == 0 and g14[:, 1:].abs().max() > 0
    assert BACKBONES["mvit_v2_s"].tokens.module == "net.blocks.14"


@pytest.mark.parametrize("arch", ARCHS)
def test_cam_of_a_checkpoint(tmp_path, arch):
    """``moquad cam`` on a 4 x 64 clip: a (2, 2, 2) token grid, upsampled to the clip, nonzero, as recorded."""
    from moquad.eval.cam import cam

    data = make_tiny_dataset(tmp_path / "data", {"train": 2, "test": 1}, frames=8)
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", arch, 4, 64)
    png = cam("test/v_Red_00.avi", eval_cfg(data, ckpt, tmp_path / "out", size=64), str(tmp_path / "c.png"))
    meta = json.loads(png.with_suffix(".json").read_text())
    assert meta["method"] == "projection" and meta["token_grid"] == [2, 2, 2] and meta["positive_tokens"] >= 1
    assert meta["tokens"] == BACKBONES[arch].tokens.what


@pytest.mark.parametrize("arch", ARCHS)
def test_extract_features_dim(tmp_path, arch):
    from moquad.eval.features import extract, read_features

    data = make_tiny_dataset(tmp_path / "data", {"train": 2, "test": 3}, frames=8)
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", arch, 2, 16)
    f = read_features(extract(eval_cfg(data, ckpt, tmp_path / "out", frames=2, size=16, num_clips=1), "test"))
    assert f["embedding"].shape == (3, 768) and abs(f["embedding"]).max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_recipes_by_name_use_adamw_vit_and_name_their_source(arch):
    from moquad import settings
    from moquad.recipes import find_recipe

    train_recipe = find_recipe(f"k400_{arch}_moquad_dagger", "train")
    cfg = settings.resolve(C.PretrainConfig(), train_recipe, {})
    assert (cfg.backbone, cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.lr_warmup_epochs) == (
        arch, "adamw_vit", 1.5e-4, 0.1, 40.0)  # MoCo v3's ViT pre-training
    assert (cfg.loader.frames, cfg.loader.size, cfg.batch_size) == (16, 224, 256)
    eval_recipe = find_recipe(f"finetune_ucf101_{arch}", "eval")
    ev = settings.resolve(C.EvalConfig(), eval_recipe, {})
    ft = ev.finetune
    assert (ft.optimizer, ft.lr, ft.batch_size, ft.weight_decay, ft.epochs) == ("adamw_vit", 2.5e-4, 128, 0.05, 100)
    assert (ev.frames, ev.dilation, ev.size, ev.num_clips, ev.crops) == (None, 4, None, 10, 3)  # stride 4; the clip: the checkpoint's
    assert "moco-v3" in train_recipe.read_text() and "VideoMAE" in eval_recipe.read_text()
