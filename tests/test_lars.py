"""LARS against SimCLR's update rule written out with numpy, step by step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from moquad.train.lars import LARS, param_groups
from moquad.train.optimizers import OPTIMIZERS, make_optimizer


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3, bias=False))


def test_param_groups_exclude_bn_and_bias():
    m = _model()
    regular, special = param_groups(m, 1e-6)
    assert {id(p) for p in regular["params"]} == {id(m[0].weight), id(m[3].weight)}
    assert {id(p) for p in special["params"]} == {id(m[0].bias), id(m[1].weight), id(m[1].bias)}
    assert special["weight_decay"] == 0.0 and not special["lars_adapt"]


def test_lars_matches_formula_step_by_step():
    m = _model()
    wd, mom, eeta = 1e-2, 0.9, 1e-3
    opt = LARS(param_groups(m, wd), lr=0.0, momentum=mom, weight_decay=wd, eeta=eeta)
    adapt = {id(p): g["lars_adapt"] for g in opt.param_groups for p in g["params"]}
    params = list(m.parameters())
    ref_w = [p.detach().double().numpy().copy() for p in params]
    ref_v = [np.zeros_like(w) for w in ref_w]
    x = torch.randn(8, 6)
    for step, lr in enumerate([0.5, 1.0, 0.3]):
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        (m(x) ** 2).mean().backward()
        grads = [p.grad.double().numpy().copy() for p in params]
        opt.step()
        for k, p in enumerate(params):
            g = grads[k]
            if adapt[id(p)]:
                g = g + wd * ref_w[k]
                wn, gn = np.linalg.norm(ref_w[k]), np.linalg.norm(g)
                trust = eeta * wn / gn if wn > 0 and gn > 0 else 1.0
            else:
                trust = 1.0
            ref_v[k] = mom * ref_v[k] + lr * trust * g
            ref_w[k] = ref_w[k] - ref_v[k]
            np.testing.assert_allclose(
                p.detach().double().numpy(), ref_w[k], rtol=1e-5, atol=1e-7, err_msg=f"param {k} step {step}"
            )
    # BN weight moved by the plain lr (no trust ratio): a large step compared with adapted weights
    assert not np.allclose(ref_w[2], 1.0)


def test_zero_weight_uses_trust_one():
    p = nn.Parameter(torch.zeros(3))
    opt = LARS([{"params": [p], "weight_decay": 0.0, "lars_adapt": True}], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.full((3,), -0.1))


def test_optimizer_table_builds_each_row():
    """One table, name -> builder; every row gets the two groups (no decay on BN and bias)."""
    from moquad.train.scaled_adamw import ScaledAdamW

    assert list(OPTIMIZERS) == ["lars", "sgd", "adamw", "adamw_vit"]
    kinds = {"lars": LARS, "sgd": torch.optim.SGD, "adamw": torch.optim.AdamW, "adamw_vit": ScaledAdamW}
    for name in OPTIMIZERS:
        opt = make_optimizer(_model(), name, 0.1, 1e-4)
        assert type(opt) is kinds[name]
        assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0] and opt.param_groups[0]["lr"] == 0.1
    assert make_optimizer(_model(), "sgd", 0.1, 0.0).param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match="unknown optimizer 'adam9'; choose one of lars, sgd, adamw, adamw_vit"):
        make_optimizer(_model(), "adam9", 0.1, 0.0)
