"""Clip indices (one rule for training and evaluation, no jump cuts) and the speeds of a video."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moquad.data.clip_frames import (
    clip_indices,
    clip_span,
    draw_speeds,
    fitting,
    random_clip,
    unfit_counts,
    uniform_clips,
)


def test_clip_indices_spacing_and_span():
    idx = clip_indices(100, 16, 4, start=7)
    assert idx.tolist() == [7 + 4 * i for i in range(16)]
    assert clip_span(16, 4) == idx[-1] - idx[0] + 1
    with pytest.raises(ValueError, match="start"):
        clip_indices(100, 16, 4, start=40)  # would run past the end: never wraps


def test_random_clip_fits_when_video_is_long_enough():
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(400):
        idx = random_clip(40, 8, 2, rng)  # span 15: starts 0..25
        assert np.all(np.diff(idx) == 2) and idx[-1] < 40
        starts.add(int(idx[0]))
    assert starts == set(range(26))  # every legal start is reachable, no other


def test_a_clip_that_does_not_fit_is_the_whole_video_stretched_never_looped_or_frozen():
    idx = random_clip(10, 16, 2, np.random.default_rng(1))  # span 31 > 10 frames
    assert idx.tolist() == np.rint(np.linspace(0, 9, 16)).astype(int).tolist()
    assert idx[0] == 0 and idx[-1] == 9 and np.all(np.diff(idx) >= 0)  # monotone: no wrap, no cut
    counts = np.bincount(idx, minlength=10)
    assert counts.max() - counts.min() <= 1  # repeats spread evenly, not a frozen tail
    assert clip_indices(1, 4, 3, 0).tolist() == [0, 0, 0, 0]
    assert uniform_clips(10, 16, 2, 3).tolist() == [idx.tolist()] * 3  # evaluation: the same rule


def test_speeds_among_the_dilations_that_fit():
    rng = np.random.default_rng(0)
    assert fitting(40, 16, (1, 2, 4)) == [1, 2]  # spans 16, 31, 61
    pairs = {draw_speeds(300, 16, (1, 2, 4), rng) for _ in range(300)}
    assert pairs == {(n, m, "speed") for n, m in itertools.permutations((1, 2, 4), 2)}
    pairs = {draw_speeds(40, 16, (1, 2, 4), rng) for _ in range(100)}
    assert pairs == {(1, 2, "speed"), (2, 1, "speed")}  # dilation 4 does not fit a 40-frame video
    assert draw_speeds(20, 16, (1, 2, 4), rng) == (1, 1, "reverse")  # only one fits: Intra-Negs reversed
    assert draw_speeds(10, 16, (1, 2, 4), rng) == (1, 1, "stretch")  # none fits


def test_unfit_counts():
    assert unfit_counts([10, 20, 40, 61, 300], 16, (1, 2, 4)) == {1: 1, 2: 2, 4: 3}


def test_same_rng_same_clip():
    a = random_clip(300, 16, 4, np.random.default_rng(5))
    b = random_clip(300, 16, 4, np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_uniform_clips_cover_the_video():
    clips = uniform_clips(100, 16, 2, 5)
    starts = [int(c[0]) for c in clips]
    assert starts[0] == 0 and clips[-1][-1] == 99 and starts == sorted(starts)
    assert all(np.all(np.diff(c) == 2) for c in clips)
    assert uniform_clips(100, 16, 2, 1)[0][0] == (100 - 31) // 2  # one clip: centred
