"""moquad.eval.report: the confusion matrix figure (counts in cells, row-normalised colours, said so)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from moquad.eval.report import confusion_figure, plot_confusion


def test_confusion_has_counts_and_says_it_is_row_normalised(tmp_path):
    conf = np.array([[5, 1, 0], [2, 3, 1], [0, 0, 6]])
    fig = confusion_figure(conf, ["walk", "run", "jump"], "fine-tuned")
    ax = fig.axes[0]
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): int(t.get_text()) for t in ax.texts}
    assert cells == {(i, j): int(conf[i, j]) for i, j in zip(*np.nonzero(conf))}  # every non-empty cell's count
    assert np.allclose(ax.images[0].get_array(), conf / conf.sum(1, keepdims=True))  # rows sum to 1
    assert "row-normalised" in ax.get_title() and "18 test videos" in ax.get_ylabel()
    assert fig.axes[1].get_ylabel() == "share of the true class's videos"  # the colour bar says what it scales
    plt.close(fig)
    png = plot_confusion(conf, ["walk", "run", "jump"], tmp_path / "c.png", "t")
    assert png.stat().st_size > 5000
