"""The ``adamw_vit`` row of the optimizer table: which parameters get no weight decay and which lr scale, against a
direct listing of each transformer's parameter names; ScaledAdamW against torch's AdamW at the scaled lr."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from moquad.models import build_backbone, build_model
from moquad.train.optimizers import LAYER_DECAY, make_optimizer
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
