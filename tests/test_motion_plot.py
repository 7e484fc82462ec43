"""moquad.eval.motion_plot: Wilson intervals against scipy and the textbook value, the test-clip counts of the
held-out classifiers, the figure's n, intervals and left-out empty panel."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import BarContainer
from scipy.stats import binomtest

from moquad.eval.motion import held_out_accuracy
from moquad.eval.motion_plot import PANELS, figure, held_out_clips, wilson


@pytest.mark.parametrize("k, n", [(8, 10), (0, 12), (12, 12), (39, 40), (28, 60), (1, 3)])
def test_wilson_matches_scipy(k, n):
    want = binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert wilson(k / n, n) == pytest.approx((want.low, want.high), abs=1e-9)


@pytest.mark.parametrize("n", range(1, 40))
def test_wilson_holds_p_at_zero_and_one(n):
    """At p = 0 or 1 the bounds are p itself, not 1e-16 beside it (n = 10 gave 0.9999999999999999 at p = 1: a
    negative error bar, which stopped ``moquad motion`` writing its plot)."""
    assert wilson(1.0, n)[1] == 1.0 and wilson(0.0, n)[0] == 0.0


def test_wilson_textbook_value():
    # 8 successes in 10 trials, 95 %: 0.490 to 0.943 (Newcombe 1998, Table I style; Agresti & Coull 1998)
    lo, hi = wilson(0.8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)


@pytest.mark.parametrize("videos, classes", [(5, 2), (6, 3), (7, 2), (40, 3), (2, 2)])
def test_held_out_clips_is_the_classifiers_test_set(videos, classes):
    """The accuracy of held_out_accuracy is a count over exactly held_out_clips test clips, for any features."""
    rng = np.random.default_rng(videos * 10 + classes)
    groups = [rng.normal(size=(videos, 6)) + c for c in range(classes)]
    acc, n = held_out_accuracy(groups, seed=0), held_out_clips(videos, classes)
    assert abs(acc * n - round(acc * n)) < 1e-9 and n == classes * (videos - videos // 2 if videos > 1 else 0)
    perfect = [np.full((videos, 6), 10.0 * c) + rng.normal(size=(videos, 6)) * 1e-3 for c in range(classes)]
    assert held_out_accuracy(perfect, seed=0) == 1.0  # a separable task: all n right


def _result(pairs: bool) -> dict:
    enc = {"arrow_of_time_top1": 0.975, "speed_top1": 0.5, "appearance_share": 0.9,
           "ratio_to_crop": {"reversed": 0.4, "speed2": 0.1, "speed4": 0.1, "mirror": 0.5, "still": 0.4}}
    if pairs:
        enc["direction_pairs"] = {"pairs": {"a | b": 0.3}, "mean": 0.3}
    return {"encoders": {"moquad": enc, "random": {**enc, "direction_pairs": None}},
            "data": {"videos": 40, "split": "test", "dir": "/d/data"}, "protocol": {"frames": 8, "size": 32}}


@pytest.mark.parametrize("pairs", [False, True])
def test_figure_gives_n_and_intervals_and_leaves_out_an_empty_panel(pairs):
    fig = figure(_result(pairs))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == (4 if pairs else 3) and any(t.startswith("Direction pairs") for t in titles) == pairs
    acc = fig.axes[0]
    assert [t.get_text() for t in acc.get_xticklabels()] == ["forward vs\nreversed\nn = 40 test clips",
                                                             "speed\n1x / 2x / 4x\nn = 60 test clips"]
    assert "Wilson 95 % intervals" in acc.get_title() and "n = 40 videos" in fig._suptitle.get_text()
    whiskers = [c for c in acc.containers if isinstance(c, BarContainer) and c.errorbar is not None]
    lo, hi = wilson(0.975, 40)
    seg = whiskers[0].errorbar.lines[2][0].get_segments()[0]  # the first encoder's arrow-of-time bar
    assert np.allclose(seg[:, 1], [100 * lo, 100 * hi])
    assert PANELS[3][0] == "Direction pairs"
    plt.close(fig)
