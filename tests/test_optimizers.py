"""The ``adamw_vit`` row of the optimizer table: which parameters get no weight decay and which lr scale, against a
direct listing of each transformer's parameter names; ScaledAdamW against torch's AdamW at the scaled lr. The
pre-training optimizer: the backbone row's and its setting unless a recipe or a flag sets them."""

from __future__ import annotations

import re

import pytest
import torch
import yaml
from torch import nn

from moquad import settings
from moquad.config import PretrainConfig
from moquad.errors import MoquadError
from moquad.models import BACKBONES, build_backbone, build_model
from moquad.train.optimizers import LAYER_DECAY, OPTIMIZERS, make_optimizer, pretrain_optimizer
from moquad.train.scaled_adamw import ScaledAdamW

# parameter names that must not decay, written out per architecture (torchvision's module names)
NO_DECAY = {
    "swin3d_t": r"(\.bias|patch_embed\.norm\.weight|\.norm\d?\.weight|relative_position_bias_table)$",
    "mvit_v2_s": r"(\.bias|\.norm\d?\.weight|norm_act\.0\.weight|rel_pos_[hwt]|class_token)$",
}


class _Classifier(nn.Module):
    """What ``moquad finetune`` optimises: a backbone and a new linear classifier."""

    def __init__(self, arch: str):
        super().__init__()
        self.backbone, dim = build_backbone(arch)
        self.fc = nn.Linear(dim, 5)


def _groups_by_name(module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, tuple[float, float]]:
    where = {id(p): (g["weight_decay"], g["lr_scale"]) for g in opt.param_groups for p in g["params"]}
    return {n: where[id(p)] for n, p in module.named_parameters()}


@pytest.mark.parametrize("arch", ["swin3d_t", "mvit_v2_s"])
def test_no_decay_on_norms_biases_and_position_tables(arch):
    model = build_model(arch, proj_dim=16, proj_hidden=32)
    got = _groups_by_name(model, make_optimizer(model, "adamw_vit", 1e-3, 0.05))
    want_off = {n for n in got if re.search(NO_DECAY[arch], n) or n.startswith("head.net.1.")}  # head's BatchNorm1d
    assert {n for n, (wd, _) in got.items() if wd == 0.0} == want_off
    assert {wd for n, (wd, _) in got.items() if n not in want_off} == {0.05}
    assert {s for _, s in got.values()} == {1.0}  # pre-training: no layer-wise decay
    tables = [n for n in got if "rel" in n and ("pos" in n or "position" in n)]
    assert len(tables) == {"swin3d_t": 12, "mvit_v2_s": 48}[arch] and all(got[n][0] == 0.0 for n in tables)


@pytest.mark.parametrize("arch,layers", [("swin3d_t", 12), ("mvit_v2_s", 16)])
def test_layer_wise_lr_decay_when_fine_tuning(arch, layers):
    net = _Classifier(arch)
    got = _groups_by_name(net, make_optimizer(net, "adamw_vit", 1e-3, 0.05, finetune=True))
    d = LAYER_DECAY
    first_block, last_block, stem = {
        "swin3d_t": ("backbone.net.features.0.0.mlp.0.weight", "backbone.net.features.6.1.mlp.0.weight",
                     "backbone.net.patch_embed.proj.weight"),
        "mvit_v2_s": ("backbone.net.blocks.0.mlp.0.weight", "backbone.net.blocks.15.mlp.0.weight",
                      "backbone.net.conv_proj.weight"),
    }[arch]
    want = {"fc.weight": (0.05, 1.0), "fc.bias": (0.0, 1.0), "backbone.net.norm.weight": (0.0, 1.0),
            last_block: (0.05, d), first_block: (0.05, d ** layers), stem: (0.05, d ** (layers + 1))}
    for name, (wd, scale) in want.items():
        assert got[name][0] == wd and got[name][1] == pytest.approx(scale, rel=1e-12), name
    if arch == "swin3d_t":  # patch merging before stage 3 learns with stage 3's first block (block 5 of 12)
        assert got["backbone.net.features.3.reduction.weight"][1] == pytest.approx(d ** (layers + 1 - 5))
        assert got["backbone.net.features.4.0.mlp.0.weight"][1] == pytest.approx(d ** (layers + 1 - 5))
    else:
        assert got["backbone.net.pos_encoding.class_token"] == (0.0, pytest.approx(d ** (layers + 1)))
    # the scale falls by exactly one factor per layer, over every layer
    scales = sorted({s for _, s in got.values()})
    assert scales == pytest.approx([d ** k for k in range(layers + 1, -1, -1)])


def test_scaled_adamw_is_adamw_at_the_scaled_lr():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ours = ScaledAdamW([{"params": [a.weight], "lr_scale": 0.25, "weight_decay": 0.1},
                        {"params": [a.bias], "lr_scale": 1.0, "weight_decay": 0.0}], lr=1e-2)
    ref = torch.optim.AdamW([{"params": [b.weight], "lr": 2.5e-3, "weight_decay": 0.1},
                             {"params": [b.bias], "lr": 1e-2, "weight_decay": 0.0}], lr=1e-2)
    for _ in range(3):
        x = torch.randn(8, 4)
        for net, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            net(x).pow(2).sum().backward()
            opt.step()
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)
    torch.testing.assert_close(a.bias, b.bias, rtol=0, atol=0)
    assert [g["lr"] for g in ours.param_groups] == [1e-2, 1e-2]  # the schedule's lr, unscaled, is what is kept


# ---------------------------------------------------------------- the pre-training optimizer: the backbone's, unless set


@pytest.mark.parametrize("name", list(BACKBONES))
def test_pretrain_optimizer_is_the_backbone_rows_with_its_setting(name):
    """Nothing set: the row's optimizer (adamw_vit for the transformers) and that optimizer's setting, as the
    command line resolves it too; the start-up line says both are defaults and names the setting's source."""
    row = BACKBONES[name]
    cfg, line = pretrain_optimizer(PretrainConfig(backbone=name))
    setting = OPTIMIZERS[row.optimizer].pretrain
    assert row.optimizer == ("adamw_vit" if name in ("swin3d_t", "mvit_v2_s") else "lars")
    assert (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.lr_warmup_epochs) == (
        row.optimizer, setting.lr, setting.weight_decay, setting.lr_warmup_epochs)
    assert line.startswith(f"pretrain: optimizer {row.optimizer} (the {name} backbone's default), lr ")
    assert line.endswith(f"(lr, weight decay, warm-up: {setting.source})")
    assert settings.resolve(PretrainConfig(), None, {"backbone": name}) == cfg


def test_a_set_optimizer_or_value_wins_and_the_paper_setting_is_lars():
    cfg, line = pretrain_optimizer(PretrainConfig(backbone="swin3d_t", optimizer="lars", lr=0.5))
    assert (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.lr_warmup_epochs) == ("lars", 0.5, 1e-6, 10.0)
    assert line == ("pretrain: optimizer lars (set; the swin3d_t backbone's default is adamw_vit), lr 0.5 at batch "
                    "256, weight decay 1e-06, 10 warm-up epochs (weight decay, warm-up: the paper's LARS setting)")
    cfg, line = pretrain_optimizer(PretrainConfig(optimizer="adamw_vit", lr=1e-3, weight_decay=0.05,
                                                  lr_warmup_epochs=2))
    assert line == ("pretrain: optimizer adamw_vit (set; the r3d_18 backbone's default is lars), lr 0.001 at batch "
                    "256, weight decay 0.05, 2 warm-up epochs")
    assert pretrain_optimizer(cfg) == (cfg, line)  # settled: nothing left to fill, the same line
    with pytest.raises(MoquadError, match="optimizer sgd has no pre-training setting; set lr, lr_warmup_epochs"):
        settings.resolve(PretrainConfig(), None, {"optimizer": "sgd", "weight_decay": 0.0})


def test_swin_without_a_recipe_trains_with_adamw_and_says_so(tmp_path):
    """``moquad pretrain --backbone swin3d_t`` (no recipe, no optimizer): the run's config.yaml and checkpoint say
    adamw_vit with MoCo v3's setting, the start-up line says it is the backbone's, and the optimizer is AdamW."""
    from test_features import make_tiny_dataset
    from typer.testing import CliRunner

    from moquad.cli import app
    from moquad.train import checkpoint

    data = make_tiny_dataset(tmp_path / "data", {"train": 4}, frames=12)
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["pretrain", "--data", str(data), "--out", str(run), "--backbone", "swin3d_t",
                                 "--epochs", "1", "--batch-size", "2", "--frames", "2", "--size", "16", "--workers",
                                 "0", "--device", "cpu", "--set", "steps_per_epoch=1", "--set", "proj_hidden=16"],
                           terminal_width=400)
    assert r.exit_code == 0, r.output
    assert "pretrain: optimizer adamw_vit (the swin3d_t backbone's default), lr 0.00015 at batch 256, weight decay " \
           "0.1, 40 warm-up epochs (lr, weight decay, warm-up: MoCo v3's ViT setting)" in r.output
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["optimizer"], saved["lr"], saved["weight_decay"], saved["lr_warmup_epochs"]) == (
        "adamw_vit", 1.5e-4, 0.1, 40.0)
    ckpt = checkpoint.load(run / "checkpoints" / "last.pt")
    assert ckpt["config"]["optimizer"] == "adamw_vit" and "betas" in ckpt["optimizer"]["param_groups"][0]  # Adam's
