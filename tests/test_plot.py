"""moquad.train.plot: the smoothing against its direct formula; the rank panel's candidates and chance level; the
epoch marks; curves.png from a run folder."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from moquad.config import LoaderConfig, PretrainConfig
from moquad.config import save as save_config
from moquad.train.plot import candidates, ema, plot_run, run_figure, smoothing_window


@pytest.mark.parametrize("window", [1, 3, 10])
def test_ema_is_the_debiased_exponential_average(window):
    x = np.random.default_rng(0).normal(size=40)
    beta = 1 - 1 / window
    want = [sum(beta ** (t - i) * (1 - beta) * x[i] for i in range(t + 1)) / (1 - beta ** (t + 1))
            for t in range(len(x))]  # the direct sum, term by term in float64
    assert np.allclose(ema(x, window), want, rtol=0, atol=1e-12)
    assert ema([5.0, 5.0, 5.0], 4).tolist() == pytest.approx([5.0] * 3)  # debiased: a constant stays itself


def _run(tmp_path, steps=30, spe=5, batch=8, **kw):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    cfg = PretrainConfig(data="d", out=str(run), batch_size=batch, loader=LoaderConfig(**kw))
    save_config(cfg, run / "config.yaml")
    rng = np.random.default_rng(1)
    with open(run / "log.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "epoch": (s - 1) // spe, "mode": "moquad", "loss": 4 - s / 10 + rng.normal(),
                                "lr": 0.1, "rank_ad_pos": 10 + rng.normal(), "rank_intra_neg": 8.0}) + "\n")
    return run


def test_candidates_are_every_other_view_of_the_global_batch(tmp_path):
    # the quadruple (anchor, AD-Pos, Intra-Neg, AD-Intra-Neg) x batch 8 -> 31; two motion ops: 6 views -> 47
    assert candidates(_run(tmp_path), "moquad") == 8 * 4 - 1
    assert candidates(_run(tmp_path / "b", motion_ops=("speed", "reverse")), "moquad") == 8 * 6 - 1
    assert candidates(_run(tmp_path / "c"), "appearance") == 8 * 2 - 1  # the warm-up: two clips
    (tmp_path / "c" / "run" / "config.yaml").unlink()
    assert candidates(tmp_path / "c" / "run", "moquad") is None


def test_the_figure_smooths_marks_epochs_and_draws_chance(tmp_path):
    run = _run(tmp_path)
    fig = run_figure(run)
    loss, _, ranks = fig.axes[:3]
    raw, smooth = loss.get_lines()[:2]
    window = smoothing_window(30)
    assert raw.get_alpha() < 0.5 and np.allclose(smooth.get_ydata(), ema(raw.get_ydata(), window))
    assert "31 candidates" in ranks.get_title()
    chance = [c for c in ranks.collections if c.get_label().startswith("chance")]
    assert len(chance) == 1 and np.allclose(chance[0].get_segments()[0][:, 1], (31 + 1) / 2)
    ends = sorted({line.get_xdata()[0] for line in loss.get_lines()[2:]})
    assert ends == [5, 10, 15, 20, 25]  # the last step of each epoch but the last
    assert all([c.get_xlabel() for c in ax.child_axes] == ["epoch"] for ax in fig.axes)  # an epoch axis on top
    plt.close(fig)
    png = plot_run(run)
    assert png == run / "curves.png" and png.stat().st_size > 10_000


@pytest.mark.parametrize("method, sets", [("moco", {"queue_size": 128}), ("moco_moquad", {"queue_size": 64}),
                                          ("moco", {"queue_size": 32, "symmetric": True}), ("moquad", {})])
def test_the_chance_line_is_where_random_embeddings_rank_the_positive(tmp_path, method, sets):
    """The chance level the plot draws, (candidates + 1) / 2, is within 5 % of the mean rank the run's own loss
    gives the positive among random embeddings: the stage's views through its routing, the batch's other videos,
    a full queue (its keys of other videos). Batch 8, the quadruple (moco: anchor and plain positive)."""
    import torch

    from moquad.train.losses import Projections
    from moquad.train.methods import MAIN, METHODS, resolve

    run = tmp_path / "run"
    run.mkdir()
    cfg = PretrainConfig(data="d", out=str(run), method=method, batch_size=8, **sets)
    save_config(cfg, run / "config.yaml")
    row = METHODS[method].configured(cfg)
    stage = row.stage(MAIN)
    count = candidates(run, stage.name)
    roles, slot = stage.plan(cfg.loader).roles, row.momentum
    g, ranks = torch.Generator().manual_seed(0), []
    for step in range(200):
        video = torch.arange(8) + 8 * step
        if slot is None:
            p = Projections(torch.randn(8, len(roles), 16, generator=g), roles, video=video)
        else:
            on, ky = [r for r in roles if r in slot.online], tuple(r for r in roles if r in slot.keys)
            p = Projections(torch.randn(8, len(on), 16, generator=g), tuple(on), video=video,
                            keys=torch.randn(8, len(ky), 16, generator=g), key_roles=ky,
                            queue=torch.randn(cfg.queue_size, 16, generator=g),
                            queue_video=torch.arange(cfg.queue_size) + 10_000)
        ranks.append(float(resolve(stage.loss)(p, **stage.params(cfg))[1]["rank_pos"]))
    assert abs(np.mean(ranks) - (count + 1) / 2) < 0.05 * (count + 1) / 2, (count, np.mean(ranks))
    if method == "moco" and not sets.get("symmetric"):
        assert count == 8 + 128  # the case: batch 8, queue 128 -> chance at 68.5, not 8
