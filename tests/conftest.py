"""Shared fixtures: real clips beside the checkout and a small synthetic UCF101-layout dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "real-videos"


@pytest.fixture(scope="session")
def real_videos_dir() -> Path:
    """The 19 real clips in ../shared/data/real-videos (skips when absent)."""
    if not REAL_VIDEOS.is_dir():
        pytest.skip(f"real clips not found at {REAL_VIDEOS}")
    return REAL_VIDEOS


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory) -> Path:
    """A tiny synthetic motion dataset in UCF101 layout (4 classes x 4 videos, 32 px, 24 frames)."""
    from moquad.synth import make_synth

    return make_synth(tmp_path_factory.mktemp("synth"), classes=4, per_class=4, size=32, frames=24, seed=0)
