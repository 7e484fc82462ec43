"""Adding a pre-training method is ONE table entry with its code in one module, even for a method with a teacher:
a symmetric BYOL (tests/byol_method.py: both views query, a predictor, no negatives) and a DINO-style method
(tests/dino_method.py: teacher output centred and sharpened, the centre a state the checkpoint keeps, its own
hyperparameters). Each trains through the trainer with its row patched into the table and no other file changed;
the DINO run resumes bit for bit after a signal mid-epoch (its centre included)."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from byol_method import ENTRY as BYOL
from byol_method import byol_loss
from dino_method import ENTRY as DINO
from dino_method import DinoLoss
from test_loop import make_cfg, train
from test_momentum import _stop_at, _video_loader

from moquad.train import methods, preempt
from moquad.train.checkpoint import load
from moquad.train.log import read_log
from moquad.train.losses import Projections


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def _pair(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 2, 6, generator=g, dtype=torch.float64), torch.randn(3, 2, 6, generator=g, dtype=torch.float64)


def _cos(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def test_symmetric_byol_loss_matches_the_formula():
    z, keys = _pair()  # z: predictions of (anchor, positive); keys: targets of (anchor, positive)
    loss, _ = byol_loss(Projections(z.float(), ("anchor", "positive"), keys=keys.float(),
                                    key_roles=("anchor", "positive")))
    want = sum(2 - 2 * _cos(z[i, 0], keys[i, 1]) + 2 - 2 * _cos(z[i, 1], keys[i, 0]) for i in range(3)) / 6
    assert float(loss) == pytest.approx(want, rel=1e-6)


def test_dino_loss_and_centre_match_the_formula():
    s, t = _pair(1)
    fn = DinoLoss()
    fn.center = torch.tensor([0.1, -0.2, 0.0, 0.3, 0.0, 0.05])
    centre = fn.center.double().clone()
    loss, _ = fn(Projections(s.float(), ("anchor", "positive"), keys=t.float(), key_roles=("anchor", "positive")),
                 student_temp=0.1, teacher_temp=0.04, center_momentum=0.9)

    def softmax(x):
        e = [math.exp(v - max(x)) for v in x]
        return [v / sum(e) for v in e]

    want = 0.0
    for i in range(3):
        for j, other in ((0, 1), (1, 0)):
            target = softmax([(float(t[i, other, d]) - float(centre[d])) / 0.04 for d in range(6)])
            student = softmax([float(s[i, j, d]) / 0.1 for d in range(6)])
            want -= sum(p * math.log(q) for p, q in zip(target, student))
    assert float(loss) == pytest.approx(want / 6, rel=1e-5)
    torch.testing.assert_close(fn.center.double(), 0.9 * centre + 0.1 * t.mean(dim=(0, 1)), rtol=1e-6, atol=1e-7)


def test_a_symmetric_byol_is_one_table_entry(tmp_path):
    out = tmp_path / "run"
    with mock.patch.dict(methods.METHODS, {"byol": BYOL}):
        train(make_cfg(out, method="byol", epochs=1, steps_per_epoch=2), _video_loader, tensorboard=False,
              progress=False)
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


def _dino_cfg(out, **kw):
    return make_cfg(out, method="dino", epochs=2, **kw)


def test_a_dino_style_method_is_one_table_entry_and_resumes_exactly(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    with mock.patch.dict(methods.METHODS, {"dino": DINO}):
        train(_dino_cfg(full), _video_loader, tensorboard=False, progress=False)
        with pytest.raises(preempt.Preempted):
            train(_dino_cfg(part), _stop_at(5), tensorboard=False, progress=False)
        assert load(part / "checkpoints" / "last.pt")["step"] == 6
        train(_dino_cfg(part, resume=True), _video_loader, tensorboard=False, progress=False)
    a, b = read_log(full / "log.jsonl"), read_log(part / "log.jsonl")
    assert [r["mode"] for r in a] == ["dino"] * 8 and all(math.isfinite(r["loss"]) for r in a)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    sa, sb = load(full / "checkpoints" / "last.pt"), load(part / "checkpoints" / "last.pt")
    centre = sa["losses"]["dino"]["center"]
    assert centre.shape == (16,) and centre.abs().sum() > 0 and torch.equal(centre, sb["losses"]["dino"]["center"])
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
