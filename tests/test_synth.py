"""The synthetic dataset: UCF101 layout, group-wise split, and classes that differ only by motion."""

from __future__ import annotations

import av
import numpy as np
import pytest

from moquad.synth import MOTIONS, make_synth


def _decode(path):
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_layout_and_split(synth_root):
    lists = synth_root / "ucfTrainTestlist"
    classes = [line.split() for line in (lists / "classInd.txt").read_text().splitlines()]
    assert classes == [[str(i + 1), n] for i, n in enumerate(MOTIONS[:4])]
    train = [line.split()[0] for line in (lists / "trainlist01.txt").read_text().splitlines()]
    test = (lists / "testlist01.txt").read_text().split()
    assert len(train) + len(test) == 16 and len(set(train) & set(test)) == 0
    # UCF101 protocol: the split is by group, so no group is on both sides
    group = lambda rel: rel.rsplit("_g", 1)[1][:2] + rel.split("/")[0]  # noqa: E731
    assert not {group(r) for r in train} & {group(r) for r in test}
    for rel in train + test:
        frames = _decode(synth_root / "UCF-101" / rel)
        assert frames.shape == (24, 32, 32, 3)


def test_deterministic(tmp_path):
    a = make_synth(tmp_path / "a", classes=2, per_class=2, size=32, frames=6, seed=3)
    b = make_synth(tmp_path / "b", classes=2, per_class=2, size=32, frames=6, seed=3)
    for rel in ["Translate/v_Translate_g01_c01.avi", "Rotate/v_Rotate_g01_c02.avi"]:
        np.testing.assert_array_equal(_decode(a / "UCF-101" / rel), _decode(b / "UCF-101" / rel))


def test_appearance_is_not_class_informative(tmp_path):
    """A still frame says nothing about the class: test-vs-train nearest-frame retrieval ~ chance."""
    root = make_synth(tmp_path / "s", classes=4, per_class=12, size=32, frames=4, seed=1)
    lists = root / "ucfTrainTestlist"
    train = [line.split()[0] for line in (lists / "trainlist01.txt").read_text().splitlines()]
    test = (lists / "testlist01.txt").read_text().split()

    def feats(rels):
        return np.stack([_decode(root / "UCF-101" / r)[0].astype(np.float32).ravel() for r in rels])

    d = ((feats(test)[:, None] - feats(train)[None]) ** 2).sum(-1)
    hits = [train[j].split("/")[0] == q.split("/")[0] for q, j in zip(test, d.argmin(1))]
    assert np.mean(hits) <= 0.5  # chance is 0.25; appearance must not separate the classes


def test_motion_is_present(synth_root):
    """Consecutive frames differ (the object moves) while the background stays put."""
    frames = _decode(synth_root / "UCF-101" / "Translate" / "v_Translate_g01_c01.avi").astype(np.int16)
    diff = np.abs(frames[4:] - frames[:-4]).sum(-1)
    moving = (diff > 60).mean(axis=(1, 2))
    assert (moving > 0.005).all() and (moving < 0.5).all()


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="--classes"):
        make_synth(tmp_path, classes=6)
    with pytest.raises(ValueError, match="--per-class"):
        make_synth(tmp_path, per_class=1)
    with pytest.raises(ValueError, match="--objects"):
        make_synth(tmp_path, objects=0)
