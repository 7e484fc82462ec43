"""The ``camera`` family over the shared real clips: disjoint train/test sources, and the class read back from
the pixels by an independent motion estimate (a global shift / scale search between frames)."""

from __future__ import annotations

import csv

import av
import numpy as np
import pytest
from PIL import Image

from moquad.preprocess.datasets import list_ucf101
from moquad.synth import make_synth
from moquad.synth_camera import CAMERA, source_split


@pytest.fixture(scope="module")
def camera_root(real_videos_dir, tmp_path_factory):
    return make_synth(tmp_path_factory.mktemp("camera"), classes=4, per_class=6, size=32, frames=16, seed=0,
                      kind="camera", source=real_videos_dir)


def _decode(path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.float64).mean(-1)


def _shift(a: np.ndarray, b: np.ndarray, r: int = 6) -> tuple[int, int]:
    """(dy, dx) that best maps frame a onto frame b: b[y + dy, x + dx] ~ a[y, x] (mean absolute error)."""
    h, w = a.shape
    best = min((np.abs(a[r:h - r, r:w - r] - b[r + dy:h - r + dy, r + dx:w - r + dx]).mean(), dy, dx)
                for dy in range(-r, r + 1) for dx in range(-r, r + 1))
    return best[1], best[2]


def _scale(a: np.ndarray, b: np.ndarray) -> float:
    """The zoom s that best maps a onto b (s > 1: the scene grows): the centre of the earlier frame of a pair,
    of side h / s, resized to h, predicts the later one (s < 1: the same with the frames swapped)."""
    h, errs = a.shape[0], []
    for s in np.linspace(0.7, 1.4, 15):
        small, big = (a, b) if s >= 1 else (b, a)
        side = h / max(s, 1 / s)
        box = ((h - side) / 2,) * 2 + ((h + side) / 2,) * 2
        pred = np.asarray(Image.fromarray(small).resize((h, h), Image.BILINEAR, box=box))
        errs.append((np.abs(pred - big)[4:-4, 4:-4].mean(), s))
    return min(errs)[1]


def test_layout_and_disjoint_sources(camera_root, real_videos_dir):
    rows = list(csv.DictReader((camera_root / "sources.csv").open()))
    assert len(rows) == 24
    train = {r["source"] for r in rows if r["split"] == "train"}
    test = {r["source"] for r in rows if r["split"] == "test"}
    assert train and test and not train & test  # no footage in both splits
    listing = list_ucf101(camera_root, 1)
    assert listing.classes == list(CAMERA[:4]) and not listing.missing
    assert sorted((v.split, v.path.name) for v in listing.videos) == sorted(
        (r["split"], r["video"].split("/")[1]) for r in rows)


def test_class_from_pixels(camera_root):
    """Pans: the scene moves opposite to the window (PanLeft -> content moves right); zooms: it grows or shrinks."""
    votes = {name: [] for name in CAMERA[:4]}
    for name in CAMERA[:4]:
        for path in sorted((camera_root / "UCF-101" / name).glob("*.avi")):
            x = _decode(path)
            if name.startswith("Pan"):
                dx = np.mean([_shift(x[t], x[t + 3])[1] for t in range(0, len(x) - 3, 3)])
                votes[name].append(dx > 0 if name == "PanLeft" else dx < 0)
            else:
                s = np.median([_scale(x[t], x[t + 6]) for t in range(0, len(x) - 6, 3)])
                votes[name].append(s > 1 if name == "ZoomIn" else s < 1)
    for name, v in votes.items():
        assert np.mean(v) >= 5 / 6, (name, v)  # real footage moves too: one video in six may disagree


def test_source_split_is_seeded_and_leaves_both_sides():
    names = [f"v{i}" for i in range(19)]
    test = source_split(names, 0)
    assert len(test) == 6 and test == source_split(names, 0) and test != source_split(names, 1)
    assert len(source_split(["a", "b"], 0)) == 1


def test_bad_sources(tmp_path, real_videos_dir):
    with pytest.raises(ValueError, match="needs --source"):
        make_synth(tmp_path / "a", kind="camera")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x.mp4").write_bytes((real_videos_dir / "test.mp4").read_bytes())
    with pytest.raises(ValueError, match="at least 2 readable videos"):
        make_synth(tmp_path / "b", kind="camera", source=tmp_path / "one", frames=8)
    with pytest.raises(ValueError, match="--classes must be between 1 and 6 for --kind camera"):
        make_synth(tmp_path / "c", kind="camera", classes=7, source=real_videos_dir)


def test_files_that_are_not_videos_are_skipped_and_named(tmp_path):
    """``--source`` holding files that are not readable videos (noise, no video stream, truncated): they are skipped,
    not a traceback; with too few videos left the error names them."""
    from test_video_file import bad_videos, write_avi

    from moquad.synth_camera import load_sources

    bad = bad_videos(tmp_path / "src")
    with pytest.raises(ValueError) as e:
        load_sources(tmp_path / "src", size=16, frames=8)
    assert "found 0" in str(e.value) and all(f"{p}: not a readable video" in str(e.value) for p in bad.values())
    write_avi(tmp_path / "src" / "a.avi")
    write_avi(tmp_path / "src" / "b.avi", frames=10)
    got = load_sources(tmp_path / "src", size=16, frames=8)
    assert [(name, len(x)) for name, x in got] == [("a.avi", 12), ("b.avi", 10)]
