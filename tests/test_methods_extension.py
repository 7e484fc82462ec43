"""Adding a pre-training method is ONE table entry (its code in one module: tests/byol_method.py, a BYOL-style
method with a predictor and no negatives): it trains two steps through the trainer and its checkpoint holds the
momentum encoder and the predictor; no other file changes."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from byol_method import ENTRY, byol_loss
from test_loop import fake_loader, make_cfg, train

from moquad.train import methods
from moquad.train.checkpoint import load
from moquad.train.log import read_log
from moquad.train.losses import Projections


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_byol_loss_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    z, keys = torch.randn(3, 1, 6, generator=g, dtype=torch.float64), torch.randn(3, 1, 6, generator=g,
                                                                                   dtype=torch.float64)
    loss, _ = byol_loss(Projections(z.float(), ("anchor",), keys=keys.float(), key_roles=("positive",)), tau=0.1,
                        hard_beta=0, hard_alpha=1)
    want = sum(2 - 2 * float(z[i, 0] @ keys[i, 0] / (z[i, 0].norm() * keys[i, 0].norm())) for i in range(3)) / 3
    assert float(loss) == pytest.approx(want, rel=1e-6)


def test_a_method_is_one_table_entry(tmp_path):
    out = tmp_path / "run"
    with mock.patch.dict(methods.METHODS, {"byol": ENTRY}):
        cfg = make_cfg(out, method="byol", epochs=1, steps_per_epoch=2)
        train(cfg, fake_loader, tensorboard=False, progress=False)
    recs = read_log(out / "log.jsonl")
    assert [r["mode"] for r in recs] == ["byol", "byol"] and all(0 < r["loss"] < 4 for r in recs)
    assert recs[0]["loss"] != recs[1]["loss"]
    ckpt = load(out / "checkpoints" / "last.pt")
    mom = ckpt["momentum"]
    assert set(mom) == {"encoder", "queue", "queue_video", "ptr", "predictor"} and mom["queue"].shape == (0, 16)
    assert set(mom["encoder"]) == set(ckpt["model"])  # an EMA copy of encoder and projection
    moved = [k for k in ckpt["model"] if ckpt["model"][k].is_floating_point()
             and not torch.equal(ckpt["model"][k], mom["encoder"][k])]
    assert moved  # trained online weights differ from their EMA
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in mom["predictor"].values())
