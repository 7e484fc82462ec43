"""Splits for folder datasets (``--split-ratios``, ``--group-by``), through the CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from test_preprocess_faults import cli, one_error, rows

from moquad.preprocess import splits
from moquad.preprocess.datasets import list_dataset
from moquad.preprocess.transcode import ffmpeg_exe

FAST = ["--short-side", "16", "--workers", "2"]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    """One 6-frame 32x24 clip; copies of it are distinct files (cheap to transcode)."""
    path = tmp_path_factory.mktemp("clip") / "clip.avi"
    subprocess.run([ffmpeg_exe(), "-y", "-v", "error", "-nostdin", "-f", "lavfi", "-i", "testsrc=s=32x24:r=25:d=0.24",
                    "-c:v", "mpeg4", str(path)], check=True)
    return path


def make_folder(root: Path, clip: Path, names: dict[str, list[str]]) -> Path:
    for cls, files in names.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(clip, root / cls / f)
    return root


def split_of(out: Path) -> dict[str, str]:
    return {vid: r["split"] for vid, r in rows(out).items()}


SIZES = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 7, "g": 10}


@pytest.mark.parametrize("ratios", ["0.8,0.2", "0.7,0.1,0.2"])
def test_ratios_within_one_video_per_class(tiny_clip, tmp_path, ratios):
    root = make_folder(tmp_path / "ds", tiny_clip, {c: [f"{c}{i}.avi" for i in range(n)] for c, n in SIZES.items()})
    r = cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), "--split-ratios", ratios, *FAST)
    assert r.returncode == 0, r.stderr
    shares = [Fraction(x) for x in ratios.split(",")]
    names = ["train", "test"] if len(shares) == 2 else ["train", "val", "test"]
    got = split_of(tmp_path / "o")
    assert len(got) == sum(SIZES.values())
    for cls, n in SIZES.items():
        held = 0
        for name, share in zip(names, shares):
            k = sum(1 for vid, s in got.items() if vid.startswith(f"{cls}/") and s == name)
            assert abs(k - n * share) < 1, (cls, name, k, n * share)  # within one video of the ratio
            held += k > 0
        # and in as many splits as that rule allows: floors >= 1, plus the leftover videos on empty splits
        floors = [int(n * sh) for sh in shares]
        can = sum(1 for f, sh in zip(floors, shares) if f == 0 and n * sh > 0)
        assert held == sum(f > 0 for f in floors) + min(n - sum(floors), can), (cls, held)
    info = json.loads((tmp_path / "o" / "dataset.json").read_text())
    assert info["split"] == {"method": "ratios", "ratios": [float(x) for x in ratios.split(",")], "seed": 0,
                             "group_by": None, "videos": {s: list(got.values()).count(s) for s in names}}
    assert info["splits"] == {s: list(got.values()).count(s) for s in names}


def test_split_is_identical_across_reruns_and_resume_keeps_it(tiny_clip, tmp_path):
    root = make_folder(tmp_path / "ds", tiny_clip, {c: [f"{c}{i}.avi" for i in range(n)] for c, n in SIZES.items()})
    args = ["--split-ratios", "0.6,0.4", "--seed", "3", *FAST]
    for out in ("o1", "o2"):
        assert cli("preprocess", "folder", str(root), "--out", str(tmp_path / out), *args).returncode == 0
    first = split_of(tmp_path / "o1")
    assert first == split_of(tmp_path / "o2")
    j1, j2 = (json.loads((tmp_path / o / "dataset.json").read_text()) for o in ("o1", "o2"))
    assert j1["split"] == j2["split"] and j1["split"]["seed"] == 3
    # the same command again is a no-op resume; another seed is a different split
    assert cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o1"), *args).returncode == 0
    assert split_of(tmp_path / "o1") == first
    assert cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o3"), "--split-ratios", "0.6,0.4",
               "--seed", "4", *FAST).returncode == 0
    assert split_of(tmp_path / "o3") != first
    # changing the split settings of an output is refused (they define the data)
    line = one_error(cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o1"), "--split-ratios", "0.5,0.5",
                         "--seed", "3", *FAST))
    assert "different settings (split_ratios)" in line


def test_resume_refuses_when_changed_files_would_move_a_written_video(tiny_clip, tmp_path):
    root = make_folder(tmp_path / "ds", tiny_clip, {"a": [f"a{i}.avi" for i in range(6)]})
    args = ["--split-ratios", "0.5,0.5", *FAST]
    assert cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), *args).returncode == 0
    before = split_of(tmp_path / "o")
    for i in range(6):  # delete a file whose absence moves another video (found with the library's own rule)
        listing = list_dataset("folder", root)
        listing.videos = [v for v in listing.videos if v.video_id != f"a/a{i}.avi"]
        splits.assign(listing, (0.5, 0.5), 0)
        if any(before[v.video_id] != v.split for v in listing.videos):
            (root / "a" / f"a{i}.avi").unlink()
            break
    else:
        pytest.fail("no deletion moves a video")
    line = one_error(cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), *args))
    assert "would now go to another split" in line and "new --out" in line


def test_groups_never_straddle_splits(tiny_clip, tmp_path):
    names = {c: [f"v_{c}_g{g:02d}_c{k}.avi" for g in range(1, 9) for k in range(1 + (g % 3))] for c in ("Jump", "Run")}
    names["Run"].append("loose_clip.avi")  # the regex does not match: a group of its own
    root = make_folder(tmp_path / "ds", tiny_clip, names)
    r = cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), "--split-ratios", "0.7,0.3",
            "--group-by", r"_g(\d+)_", *FAST)
    assert r.returncode == 0, r.stderr
    got = split_of(tmp_path / "o")
    by_group: dict[str, set[str]] = {}
    for vid, s in got.items():
        m = re.search(r"_g(\d+)_", vid)
        by_group.setdefault(m.group(1) if m else vid, set()).add(s)
    assert all(len(s) == 1 for s in by_group.values()), by_group  # across classes too: g01 of Jump and Run
    assert {next(iter(s)) for s in by_group.values()} == {"train", "test"}
    info = json.loads((tmp_path / "o" / "dataset.json").read_text())["split"]
    assert info["group_by"] == r"_g(\d+)_" and info["unmatched"] == 1
    assert info["groups"] == {n: sum(next(iter(s)) == n for s in by_group.values()) for n in ("train", "test")}
    assert sum(info["groups"].values()) == 9


@pytest.mark.parametrize("train,val,test", [("train", "val", "test"), ("Train", "Validation", "TEST")])
def test_existing_split_folders_are_honoured(tiny_clip, tmp_path, train, val, test):
    layout = {f"{train}/x": ["1.avi", "2.avi"], f"{train}/y": ["3.avi"], f"{test}/x": ["4.avi"], f"{test}/y": ["5.avi"],
              f"{val}/y": ["6.avi"]}
    root = make_folder(tmp_path / "ds", tiny_clip, layout)
    assert cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), *FAST).returncode == 0
    name = {train: "train", val: "val", test: "test"}
    expect = {f"{d}/{f}": name[d.split("/")[0]] for d, files in layout.items() for f in files}
    assert split_of(tmp_path / "o") == expect
    assert json.loads((tmp_path / "o" / "dataset.json").read_text())["classes"] == ["x", "y"]
    assert json.loads((tmp_path / "o" / "dataset.json").read_text())["split"] == {
        "method": "given", "videos": {"test": 2, "train": 3, "val": 1}}
    line = one_error(cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o2"), "--split-ratios", "0.8,0.2"))
    assert "already names its splits" in line and "drop --split-ratios" in line


@pytest.mark.parametrize("args,message", [
    (["--split-ratios", "0.8,0.3"], "sum to 1"),
    (["--split-ratios", "1"], "give 2 shares"),
    (["--split-ratios", "0.8;0.2"], "numbers separated by commas"),
    (["--split-ratios", "0.8,0.2", "--group-by", "(g"], "not a valid regular expression"),
    (["--group-by", "_g(\\d+)_"], "add --split-ratios"),
])
def test_bad_split_options_are_one_line(tiny_clip, tmp_path, args, message):
    root = make_folder(tmp_path / "ds", tiny_clip, {"x": ["1.avi"]})
    assert message in one_error(cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), *args))
    assert not (tmp_path / "o").exists()


def test_split_ratios_are_for_folder_datasets(synth_root, tmp_path):
    line = one_error(cli("preprocess", "ucf101", str(synth_root), "--out", str(tmp_path / "o"), "--split-ratios", "0.8,0.2"))
    assert "official splits" in line
