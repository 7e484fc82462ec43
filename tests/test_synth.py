"""The synthetic datasets: UCF101 layout, group-wise split, and classes that differ only by motion.

The ``directions`` family is checked against an independent motion statistic (camera shift by a
robust search, then the affine optical flow of the moving regions by least squares on the
brightness-constancy equation, as in Lucas-Kanade): it must recover the class, and say what a
horizontal flip and a time reversal turn each class into; still frames must not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import av
import cli_child as clirun
import numpy as np
import pytest
from scipy import ndimage
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from moquad import synth
from moquad.preprocess.datasets import list_ucf101
from moquad.synth import DIRECTIONS, FLIP_INVARIANT, FLIPPED, MOTIONS, REVERSED, make_synth


def _decode(path):
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _split(root: Path) -> tuple[list[str], list[str]]:
    lists = root / "ucfTrainTestlist"
    train = [line.split()[0] for line in (lists / "trainlist01.txt").read_text().splitlines()]
    return train, (lists / "testlist01.txt").read_text().split()


def _cls(rel: str) -> str:
    return rel.split("/")[0]


def _camera_shift(a: np.ndarray, b: np.ndarray, reach: int = 3) -> tuple[int, int]:
    """Integer (dy, dx) with b ~ roll(a, (dy, dx)) on most pixels, i.e. on the background."""
    shifts = [(dy, dx) for dy in range(-reach, reach + 1) for dx in range(-reach, reach + 1)]
    return min(shifts, key=lambda s: np.median(np.abs(np.roll(b, (-s[0], -s[1]), axis=(0, 1)) - a)))


def _motion_features(frames: np.ndarray) -> np.ndarray:
    """(u, v, divergence, curl) of the moving regions, camera motion removed; median over frame pairs.

    Per pair: undo the camera shift, label the connected regions that changed, and fit each an
    affine flow (u, v) = (a0 + a1 x + a2 y, b0 + b1 x + b2 y) to Ix u + Iy v + It = 0 by least
    squares. Image y points down, so curl = b1 - a2 > 0 is clockwise on screen.
    """
    g = ndimage.gaussian_filter(frames.astype(np.float64).mean(-1), (0, 1, 1), mode="wrap")
    yy, xx = np.mgrid[: g.shape[1], : g.shape[2]].astype(np.float64)
    rows = []
    for t in range(len(g) - 1):
        a = g[t]
        b = np.roll(g[t + 1], [-s for s in _camera_shift(g[t], g[t + 1])], axis=(0, 1))
        ix, iy, it = np.gradient((a + b) / 2, axis=1), np.gradient((a + b) / 2, axis=0), b - a
        labels, n = ndimage.label(ndimage.binary_dilation(np.abs(it) > 4))
        acc, weight = np.zeros(4), 0
        for k in range(1, n + 1):
            m = labels == k
            if m.sum() < 10:
                continue
            dx, dy = xx[m] - xx[m].mean(), yy[m] - yy[m].mean()
            design = np.stack([ix[m], ix[m] * dx, ix[m] * dy, iy[m], iy[m] * dx, iy[m] * dy], 1)
            p = np.linalg.lstsq(design, -it[m], rcond=None)[0]
            acc += m.sum() * np.array([p[0], p[3], p[1] + p[5], p[4] - p[2]])
            weight += m.sum()
        if weight:
            rows.append(acc / weight)
    return np.median(np.array(rows), 0)


@pytest.fixture(scope="module")
def directions_root(tmp_path_factory) -> Path:
    """All 8 directions classes, 6 videos each (2 test, 4 train), 48 px, 20 frames."""
    return make_synth(tmp_path_factory.mktemp("dirs"), classes=8, per_class=6, size=48, frames=20, seed=0,
                      kind="directions")


@pytest.fixture(scope="module")
def motion_classifier(directions_root):
    """Nearest class centroid of the standardised motion features of the TRAIN videos."""
    train, _ = _split(directions_root)
    feats = np.stack([_motion_features(_decode(directions_root / "UCF-101" / r)) for r in train])
    scale = feats.std(0)
    centroids = {c: feats[[_cls(r) == c for r in train]].mean(0) / scale for c in DIRECTIONS}

    def classify(frames: np.ndarray) -> str:
        f = _motion_features(frames) / scale
        return min(centroids, key=lambda c: ((f - centroids[c]) ** 2).sum())

    return classify


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
    with pytest.raises(ValueError, match="--kind"):
        make_synth(tmp_path, kind="sideways")
    with pytest.raises(ValueError, match="--classes must be between 1 and 8 for --kind directions"):
        make_synth(tmp_path, classes=9, kind="directions")


@pytest.mark.stored
def test_types_unchanged_by_the_directions_family(monkeypatch, tmp_path):
    """--kind types (the default) renders exactly what it did before --kind existed (commit b3cb8d2):
    the digest covers every rendered frame (before encoding, so it does not depend on the codec build). Compared
    bit for bit on every CPU: the frames are uint8 from Pillow's integer drawing and exact float32 products, and
    the digest is the same under each kernel setting of tests/kernel_settings.py (make test-kernels)."""
    digest = hashlib.sha256()

    def record(path, frames):
        digest.update(path.relative_to(tmp_path).as_posix().encode())
        digest.update(frames.tobytes())

    monkeypatch.setattr(synth, "_write_avi", record)
    make_synth(tmp_path, classes=5, per_class=4, size=32, frames=12, seed=7, objects=2)
    assert digest.hexdigest() == TYPES_DIGEST


def test_directions_layout(directions_root):
    lists = directions_root / "ucfTrainTestlist"
    classes = [line.split() for line in (lists / "classInd.txt").read_text().splitlines()]
    assert classes == [[str(i + 1), n] for i, n in enumerate(DIRECTIONS)] and len(DIRECTIONS) == 8
    train, test = _split(directions_root)
    assert len(train) == 32 and len(test) == 16  # per class: 3 groups of 2 clips, group 1 is the test split
    assert all("_g01_" in r for r in test) and not any("_g01_" in r for r in train)
    # the UCF101 reader of `moquad preprocess ucf101` sees every video with its class
    listing = list_ucf101(directions_root, 1)
    assert listing.classes == list(DIRECTIONS) and not listing.missing
    assert sorted((v.class_name, v.split) for v in listing.videos) == sorted(
        [(_cls(r), "train") for r in train] + [(_cls(r), "test") for r in test])
    assert _decode(directions_root / "UCF-101" / test[0]).shape == (20, 48, 48, 3)


def test_directions_separable_by_motion(directions_root, motion_classifier):
    """The motion statistic, fitted on train videos, names the class of every test video (chance 1/8)."""
    _, test = _split(directions_root)
    predicted = [motion_classifier(_decode(directions_root / "UCF-101" / r)) for r in test]
    assert np.mean([p == _cls(r) for p, r in zip(predicted, test)]) >= 0.9, list(zip(test, predicted))


def test_directions_flip_and_reversal_map_classes_as_documented(directions_root, motion_classifier):
    """A left-right flip makes Left Right and Clockwise CounterClockwise and keeps the first four classes;
    playing a video backwards gives the opposite direction of every class."""
    assert [FLIPPED[c] for c in DIRECTIONS[:FLIP_INVARIANT]] == list(DIRECTIONS[:FLIP_INVARIANT])
    assert all(FLIPPED[c] != c for c in DIRECTIONS[FLIP_INVARIANT:]) and all(REVERSED[c] != c for c in DIRECTIONS)
    _, test = _split(directions_root)
    videos = {r: _decode(directions_root / "UCF-101" / r) for r in test}
    flipped = [motion_classifier(v[:, :, ::-1]) == FLIPPED[_cls(r)] for r, v in videos.items()]
    reversed_ = [motion_classifier(v[::-1]) == REVERSED[_cls(r)] for r, v in videos.items()]
    assert np.mean(flipped) >= 0.9 and np.mean(reversed_) >= 0.9, (flipped, reversed_)


def _frame_statistics(frame: np.ndarray) -> np.ndarray:
    """Mean and std per channel, edge energy along x and y, and a 8-bin grey histogram of one frame."""
    f = frame.astype(np.float64)
    grey = f.mean(-1)
    hist = np.histogram(grey, bins=8, range=(0, 256))[0] / grey.size
    edges = [np.abs(np.diff(grey, axis=1)).mean(), np.abs(np.diff(grey, axis=0)).mean()]
    return np.concatenate([f.mean((0, 1)), f.std((0, 1)), edges, hist])


def test_directions_not_separable_by_appearance(tmp_path):
    """A still frame says nothing about the class: logistic regression on single-frame statistics, and
    nearest-centroid on the per-video mean colour, both stay near chance (1/8) on held-out groups."""
    root = make_synth(tmp_path / "d", classes=8, per_class=24, size=32, frames=2, seed=1, kind="directions")
    train, test = _split(root)
    first = {r: _decode(root / "UCF-101" / r)[0] for r in train + test}
    y_train, y_test = [_cls(r) for r in train], [_cls(r) for r in test]
    x_train = np.stack([_frame_statistics(first[r]) for r in train])
    x_test = np.stack([_frame_statistics(first[r]) for r in test])
    scaler = StandardScaler().fit(x_train)
    model = LogisticRegression(max_iter=2000).fit(scaler.transform(x_train), y_train)
    frame_acc = np.mean(model.predict(scaler.transform(x_test)) == np.array(y_test))
    colour = {r: first[r].reshape(-1, 3).mean(0) for r in first}
    centroids = {c: np.mean([colour[r] for r in train if _cls(r) == c], 0) for c in DIRECTIONS}
    nearest = [min(centroids, key=lambda c: ((colour[r] - centroids[c]) ** 2).sum()) for r in test]
    colour_acc = np.mean([p == _cls(r) for p, r in zip(nearest, test)])
    assert len(test) == 64
    assert frame_acc <= 0.25 and colour_acc <= 0.25, (frame_acc, colour_acc)  # chance 0.125, sd ~0.04


def test_directions_deterministic(tmp_path):
    kw = dict(classes=8, per_class=2, size=32, frames=6, kind="directions")
    a, b, c = (make_synth(tmp_path / n, seed=s, **kw) for n, s in (("a", 3), ("b", 3), ("c", 4)))
    for rel in ["ZoomIn/v_ZoomIn_g01_c01.avi", "CounterClockwise/v_CounterClockwise_g01_c02.avi"]:
        np.testing.assert_array_equal(_decode(a / "UCF-101" / rel), _decode(b / "UCF-101" / rel))
        assert not np.array_equal(_decode(a / "UCF-101" / rel), _decode(c / "UCF-101" / rel))


def test_directions_camera_pans_independently_of_the_class(monkeypatch, tmp_path):
    """Every class has videos whose whole frame pans (the background shift, measured), in varied directions."""
    videos = {}
    monkeypatch.setattr(synth, "_write_avi", lambda path, frames: videos.__setitem__(path.name, frames))
    make_synth(tmp_path, classes=4, per_class=6, size=48, frames=12, seed=2, kind="directions")
    for c in DIRECTIONS[:4]:
        pans = []
        for name, f in videos.items():
            if name.startswith(f"v_{c}_"):
                grey = f.astype(np.float64).mean(-1)
                pans.append(np.sum([_camera_shift(grey[t], grey[t + 1]) for t in range(len(grey) - 1)], 0))
        pans = np.array(pans)
        assert (np.hypot(*pans.T) >= 3).any(), (c, pans)  # pans of 3+ pixels over 11 frames
        assert len({tuple(np.sign(p)) for p in pans}) >= 3, (c, pans)  # in different directions


def test_directions_still_camera_keeps_the_videos(monkeypatch, tmp_path):
    """--camera-drift 0: no frame pair shifts (measured); each video is the default one with the camera's roll undone,
    so the still family differs from the default only by the camera (the comparison of README "Evidence")."""
    made = {}
    monkeypatch.setattr(synth, "_write_avi", lambda path, frames: made.__setitem__(path.name, frames))
    make_synth(tmp_path, classes=4, per_class=4, size=48, frames=10, seed=2, kind="directions", camera_drift=0)
    still, made = made, {}
    make_synth(tmp_path, classes=4, per_class=4, size=48, frames=10, seed=2, kind="directions")
    moved = 0
    for name, f in still.items():
        grey = f.astype(np.float64).mean(-1)
        assert all(_camera_shift(grey[t], grey[t + 1]) == (0, 0) for t in range(len(grey) - 1)), name
        g = made[name].astype(np.float64).mean(-1)
        shift = np.sum([_camera_shift(g[t], g[t + 1]) for t in range(len(g) - 1)], 0)
        moved += bool(np.any(shift))
        # undo the default video's pan at its last frame: it then equals the still one there
        assert np.median(np.abs(np.roll(g[-1], tuple(-shift), axis=(0, 1)) - grey[-1])) < 2, name
    assert moved >= len(still) // 2  # the default family does pan
    with pytest.raises(ValueError, match="--camera-drift applies to --kind directions only"):
        make_synth(tmp_path / "t", camera_drift=0)
    with pytest.raises(ValueError, match="--camera-drift must be between 0 and 8"):
        make_synth(tmp_path / "n", kind="directions", camera_drift=-1)


def test_cli_kind(tmp_path):
    """`moquad synth --kind directions` writes the class set; a bad kind or class count is one error line."""
    def run(*args):
        return clirun.python("-m", "moquad.cli", "synth", *map(str, args))

    ok = run(tmp_path / "d", "--kind", "directions", "--classes", 4, "--per-class", 2, "--size", 32, "--frames", 4)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "d" / "ucfTrainTestlist" / "classInd.txt").read_text().split()[1::2] == list(DIRECTIONS[:4])
    for args, needle in ([("--kind", "sideways"), "--kind must be one of types, directions"],
                         [("--kind", "directions", "--classes", 9), "--classes must be between 1 and 8"],
                         [("--camera-drift", 0), "--camera-drift applies to --kind directions only"]):
        bad = run(tmp_path / "bad", *args)
        assert bad.returncode == 2 and bad.stderr.startswith("error:") and needle in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


# hash of the types family's frames before --kind existed (seed 7, 5 classes x 4, 32 px, 12 frames, 2 objects)
TYPES_DIGEST = "7d459e451ffd63768c5e5b4b437f5b3e7f7dc8deadf57fbe1ddc327add788586"
