"""The method table (moquad.train.methods): each row's stages, views (roles) and loss, its momentum slot."""

from __future__ import annotations

from moquad.config import LoaderConfig
from moquad.train.methods import METHODS, NO_QUADRUPLE, resolve


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
    assert [m.stage("appearance").label for m in METHODS.values()] == ["appearance", "appearance", "simclr", "moco",
                                                                       "appearance"]
    assert [m.stage("moquad").label for m in METHODS.values()] == ["moquad", "simclr", "simclr", "moco",
                                                                   "moco_moquad"]
    assert [m.momentum is not None for m in METHODS.values()] == [False, False, False, True, True]
    for m in METHODS.values():
        for s in m.stages:
            assert callable(resolve(s.loss))
