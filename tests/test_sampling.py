"""Clip index sampling: spacing, random starts, looping of short videos, dilation pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moquad.data.sampling import clip_indices, clip_span, draw_dilations, random_clip, uniform_clips


def test_clip_indices_spacing_and_span():
    idx = clip_indices(100, 16, 4, start=7)
    assert idx.tolist() == [7 + 4 * i for i in range(16)]
    assert clip_span(16, 4) == idx[-1] - idx[0] + 1


def test_random_clip_fits_when_video_is_long_enough():
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(400):
        idx = random_clip(40, 8, 2, rng)  # span 15: starts 0..25
        assert np.all(np.diff(idx) == 2) and idx[-1] < 40
        starts.add(int(idx[0]))
    assert starts == set(range(26))  # every legal start is reachable, no other


def test_short_video_loops_and_keeps_the_step():
    rng = np.random.default_rng(1)
    for _ in range(50):
        idx = random_clip(10, 16, 2, rng)  # span 31 > 10 frames
        assert len(idx) == 16 and idx.min() >= 0 and idx.max() < 10
        steps = np.diff(idx) % 10
        assert np.all(steps == 2)  # modulo the wrap, the playback speed is unchanged
    assert clip_indices(1, 4, 3, 0).tolist() == [0, 0, 0, 0]


def test_same_rng_same_clip():
    a = random_clip(300, 16, 4, np.random.default_rng(5))
    b = random_clip(300, 16, 4, np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_draw_dilations_never_equal_and_covers_all_pairs():
    rng = np.random.default_rng(0)
    pairs = {draw_dilations((1, 2, 4), rng) for _ in range(300)}
    assert pairs == set(itertools.permutations((1, 2, 4), 2))


def test_draw_dilations_needs_two_values():
    with pytest.raises(ValueError, match="two different"):
        draw_dilations((2, 2), np.random.default_rng(0))


def test_uniform_clips_cover_the_video():
    clips = uniform_clips(100, 16, 2, 5)
    starts = [int(c[0]) for c in clips]
    assert starts[0] == 0 and clips[-1][-1] == 99 and starts == sorted(starts)
    assert all(np.all(np.diff(c) == 2) for c in clips)
