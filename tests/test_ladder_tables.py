"""The ladder's summaries (experiments/motion_ladder.py): the paired gains behind docs/guides/methods.md's evidence and
the mean +- std table, against values worked out by hand."""

from __future__ import annotations

import motion_ladder  # experiments/ is on pytest's pythonpath (pyproject.toml)


def _row(family, variant, seed, hit, knn, lin):
    return {"family": family, "variant": variant, "seed": seed, "hit@1": hit, "knn_top1": knn, "linear_top1": lin}


ROWS = [
    _row("types", "moco", 0, 0.30, 0.20, 0.40), _row("types", "moco_moquad", 0, 0.40, 0.30, 0.40),
    _row("types", "moco", 1, 0.50, 0.20, 0.50), _row("types", "moco_moquad", 1, 0.40, 0.40, 0.60),
    _row("types", "moco", 2, 0.10, 0.10, 0.10),  # seed 2 has no moco_moquad: not paired, left out
    _row("camera", "moco", 0, 0.25, 0.25, 0.25), _row("camera", "moco_moquad", 0, 0.50, 0.20, 0.25),
]


def test_compare_is_the_mean_and_std_of_per_seed_differences():
    lines = motion_ladder.compare(ROWS, ["moco:moco_moquad"]).splitlines()
    # types: hit@1 +10, -10 -> +0.0 ± 14.1; kNN +10, +20 -> +15.0 ± 7.1; linear 0, +10 -> +5.0 ± 7.1
    assert lines[2] == "| types | moco_moquad − moco | 0,1 | +0.0 ± 14.1 | +15.0 ± 7.1 | +5.0 ± 7.1 |"
    assert lines[3] == "| camera | moco_moquad − moco | 0 | +25.0 | -5.0 | +0.0 |"  # one seed: no std
    assert len(lines) == 4


def test_table_means_over_seeds():
    lines = motion_ladder.table(ROWS).splitlines()
    assert "| types | moco | 0,1,2 | 30.0 ± 20.0 | 16.7 ± 5.8 | 33.3 ± 20.8 | – |" in lines
