"""Shared fixtures: real clips beside the checkout and a small synthetic UCF101-layout dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# pytest-xdist workers share the cores: each worker (and every process it starts) gets its share of intra-op threads,
# set before torch is imported, else the OpenMP thread teams of the workers spin against each other (a test of 15 s
# of CPU took 60 s). A value the caller set is kept.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (``make test``: ``-n logical --dist loadgroup``) the tests of a module that share a module-
    or class-scoped fixture run in one worker, so the fixture is built once, not once per worker; every other test
    goes to whichever worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(defs and defs[-1].scope in ("module", "class", "package")
               for defs in (info.name2fixturedefs.get(n) for n in info.names_closure)):
            group = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False) and hasattr(item, "_id"):
                # pytest-xdist <= 3.8 marks the group by setting item._nodeid, which pytest 9 no longer reads
                # (a node's id is item._id): give the id its "@group" suffix here, as xdist means to
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")
