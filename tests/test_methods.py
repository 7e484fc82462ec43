"""The method table (moquad.train.methods): each row's stages, views (roles) and loss, its momentum slot."""

from __future__ import annotations

import pytest

from moquad.config import LoaderConfig
from moquad.train.methods import MAIN, METHODS, NO_QUADRUPLE, WARMUP, resolve


def test_rows_stages_views_and_losses():
    cfg = LoaderConfig()
    assert list(METHODS) == ["moquad", "simclr", "simclr_classic", "moco", "moco_moquad"]
    plan = {name: [s.views(LoaderConfig(**{**cfg.__dict__, **s.switches})).roles for s in m.stages]
            for name, m in METHODS.items()}
    quad, pair = ("anchor", "positive", "intra_negative", "intra_negative"), ("anchor", "positive")
    assert plan == {"moquad": [pair, quad], "simclr": [pair, pair], "simclr_classic": [pair], "moco": [pair],
                    "moco_moquad": [pair, quad]}
    assert [m.warmup for m in METHODS.values()] == [True, True, False, False, True]
    assert METHODS["simclr"].stages[-1].switches == NO_QUADRUPLE == METHODS["moco"].stages[0].switches
    assert [m.stage(WARMUP).label for m in METHODS.values()] == ["appearance", "appearance", "simclr", "moco",
                                                                 "appearance"]
    assert [m.stage(MAIN).label for m in METHODS.values()] == ["moquad", "simclr", "simclr", "moco", "moco_moquad"]
    assert [m.momentum is not None for m in METHODS.values()] == [False, False, False, True, True]
    for m in METHODS.values():
        for s in m.stages:
            assert callable(resolve(s.loss))


def test_algorithm1_stages():
    """Algorithm 1: the warm-up stage for epochs e < p * E, the main stage after; none without a warm-up stage."""
    moquad, moco = METHODS["moquad"], METHODS["moco"]
    kinds = [s.kind for s in moquad.epoch_stages(200, 0.2)]
    assert kinds.count(WARMUP) == 40 and kinds[:40] == [WARMUP] * 40 and kinds[40] == MAIN
    assert moquad.epoch_stages(3, 0.2) == [moquad.stages[0], moquad.stages[1], moquad.stages[1]]
    assert moquad.epoch_stages(3, 0.0) == [moquad.stages[1]] * 3
    assert moco.epoch_stages(3, 0.5) == [moco.stages[0]] * 3
    with pytest.raises(ValueError):
        moquad.epoch_stages(10, 1.5)
