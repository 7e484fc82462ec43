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


def test_evaluation_takes_a_rows_dilations_from_its_view_plans():
    """A new row whose clips are all at one fixed dilation is evaluated at that dilation, with no name compared
    anywhere (moquad.eval.clips asks the row); a method the table no longer has falls back to the loader's."""
    from unittest import mock

    from moquad.data import views
    from moquad.eval.clips import pretrain_clip
    from moquad.train.methods import Method, Stage

    loader = {"dilations": [1, 2, 4], "simclr_dilation": 3}
    row = Method((Stage("two", views.fixed_pair, "moquad.train.losses:nt_xent", "two"),))
    with mock.patch.dict(METHODS, {"fixed_pairs": row}):
        assert pretrain_clip({"method": "fixed_pairs", "loader": loader}).dilations == (3,)
    assert pretrain_clip({"method": "fixed_pairs", "loader": loader}).dilations == (1, 2, 4)
    assert pretrain_clip({"method": "moco_moquad", "loader": loader}).dilations == (1, 2, 4)
    assert METHODS["simclr_classic"].dilations(LoaderConfig(simclr_dilation=5)) == (5,)


def test_the_docs_and_help_list_the_table():
    """docs/guides/methods.md holds the table as methods.markdown() makes it (regenerate: python -c "from
    moquad.train.methods import markdown; print(markdown())"), and the --method help lists every row."""
    from pathlib import Path

    from moquad.cli import METHOD_HELP
    from moquad.train.methods import markdown

    root = Path(__file__).resolve().parent.parent
    assert markdown() in (root / "docs" / "guides" / "methods.md").read_text()
    assert all(f"{name}: {m.summary}" in METHOD_HELP for name, m in METHODS.items())
