"""The first hour of a new user, each stumble of it a test: what they typed, and the one line that tells them what
to do. Fast (no training, no transcoding) and independent of each other (each test its own tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import coded_video, make_checkpoint, write_dataset
from typer.testing import CliRunner

from moquad.cli import app
from moquad.preprocess.folder import list_folder
from moquad.preprocess.splits import NO_TEST_SPLIT_FIX

runner = CliRunner()


def _videos(root: Path, *names: str) -> Path:
    """Empty files with a video extension (listing a folder reads names only)."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


def _one_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# ----------------------------------------------------------------------------- class folders named like splits


def test_a_class_folder_named_test_beside_other_classes_is_explained(tmp_path):
    """``cats/ dogs/ test/``: ``test`` is read as a split, so cats and dogs would be left out; the error says how
    the folder was read and both ways out (rename the class, or move the classes into the split folders)."""
    root = _videos(tmp_path / "clips", "cats/a.mp4", "dogs/b.mp4", "test/c.mp4")
    with pytest.raises(ValueError) as e:
        list_folder(root)
    msg = str(e.value)
    assert "split folders (test) beside class folders (cats, dogs)" in msg
    assert "read as a split whose sub-folders are the classes" in msg and "rename it (e.g. test_class)" in msg
    out = tmp_path / "out"
    line = _one_error(runner.invoke(app, ["preprocess", "folder", str(root), "--out", str(out), "--workers", "1"]))
    assert "split folders (test)" in line and not out.exists()  # nothing half-written


def test_a_split_folder_holding_videos_directly_is_explained(tmp_path):
    """``train/`` holding videos (no class folders): read as a split, it has no class; the error says so."""
    root = _videos(tmp_path / "clips", "train/a.mp4", "train/walk/b.mp4")
    with pytest.raises(ValueError, match=r"train holds videos directly, but a folder named train is read as a "
                                         r"split whose sub-folders are the classes"):
        list_folder(root)


def test_split_folders_of_class_folders_are_read_as_before(tmp_path):
    """The layout the names are for is untouched, and so are other folders without videos (an annotations
    folder beside the splits)."""
    root = _videos(tmp_path / "clips", "train/cats/a.mp4", "train/dogs/b.mp4", "Test/cats/c.mp4", "notes/readme.txt")
    listing = list_folder(root)
    assert sorted((v.split, v.class_name, v.video_id) for v in listing.videos) == [
        ("test", "cats", "Test/cats/c.mp4"), ("train", "cats", "train/cats/a.mp4"), ("train", "dogs", "train/dogs/b.mp4")]


# ----------------------------------------------------------------------------- a dataset without a test split


def test_evaluating_a_dataset_without_a_test_split_repeats_the_fix(tmp_path):
    """A folder preprocessed without ``--split-ratios`` has every video in train; preprocessing said so with the
    fix, and an evaluation says it again, in the same words, instead of "no manifest for split 'test'"."""
    data = tmp_path / "data"
    write_dataset(data, [(f"v{v}", coded_video(v, 8, 16, 16), v % 2) for v in range(4)], videos_per_shard=4)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    for command in ("retrieve", "linear"):
        line = _one_error(runner.invoke(app, [command, "--data", str(data), "--checkpoint", str(ckpt)]))
        assert f"{data} has no 'test' split: every video is in train" in line
        assert line.endswith(f"{NO_TEST_SPLIT_FIX} (or pass --test-split with a split it has)")
    assert "--split-ratios 0.8,0.2" in NO_TEST_SPLIT_FIX
    # another missing split keeps the store's message, which names the splits there are
    line = _one_error(runner.invoke(app, ["retrieve", "--data", str(data), "--checkpoint", str(ckpt), "--train-split",
                                          "val"]))
    assert "no manifest for split 'val'" in line and "available: train" in line
