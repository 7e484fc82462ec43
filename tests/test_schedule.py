"""SimCLR learning-rate schedule and Algorithm 1's stage per epoch."""

from __future__ import annotations

import math

import pytest

from moquad.train.schedule import lr_schedule, scaled_lr


def test_linear_scaling():
    assert scaled_lr(3.2, 256) == pytest.approx(3.2)
    assert scaled_lr(3.2, 64) == pytest.approx(0.8)


def test_warmup_then_half_cosine():
    lrs = lr_schedule(3.2, 512, total_steps=100, warmup_steps=10).tolist()
    peak = 6.4
    assert len(lrs) == 100
    for s in range(10):
        assert lrs[s] == pytest.approx(peak * s / 10)
    for s in range(10, 100):
        assert lrs[s] == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * (s - 10) / 90)))
    assert lrs[10] == pytest.approx(peak)
    assert lrs[55] == pytest.approx(peak / 2)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_schedule_edge_cases():
    assert lr_schedule(1.0, 256, 5, 0).tolist()[0] == pytest.approx(1.0)
    assert lr_schedule(1.0, 256, 4, 10).tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75])
    with pytest.raises(ValueError):
        lr_schedule(1.0, 256, 0, 0)
