"""``moquad info`` through the CLI; every number checked against the manifests read independently."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_preprocess_faults import cli, one_error
from test_preprocess_layouts import BROKEN, make_broken

from moquad.config import LoaderConfig

CLASSES = {
    "wave": ["RATRACE_wave_f_nm_np1_fr_goo_37.avi", "SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi",
             "TrumanShow_wave_f_nm_np1_fr_med_26.avi", "part_0.mp4"],
    "soccer": ["v_SoccerJuggling_g23_c01.avi", "v_SoccerJuggling_g24_c01.avi", "test.avi"],
    "segway": ["R6llTwEh07w.mp4", "SOX5yA1l24A.mp4"],
}


@pytest.fixture(scope="module")
def dataset(real_videos_dir, tmp_path_factory):
    """3 classes of real clips + every broken file + a second name of one clip, split 0.5,0.5."""
    root = tmp_path_factory.mktemp("info") / "mine"
    for cls, clips in CLASSES.items():
        (root / cls).mkdir(parents=True)
        for clip in clips:
            (root / cls / clip).symlink_to(real_videos_dir / clip)
    make_broken(root / "wave", real_videos_dir)
    (root / "soccer" / "again.avi").symlink_to(real_videos_dir / CLASSES["soccer"][0])
    out = root.parent / "data"
    r = cli("preprocess", "folder", str(root), "--out", str(out), "--split-ratios", "0.5,0.5", "--short-side", "32",
            "--workers", "2")
    assert r.returncode == 0, r.stderr
    return out


def _run_info(out: Path, tmp_path: Path, *args: str) -> tuple[dict, str]:
    r = cli("info", str(out), "--json", str(tmp_path / "info.json"), "--out", str(tmp_path / "info.png"), *args)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / "info.json").read_text()), r.stdout


def _reference(out: Path, split: str, classes: list[str], frames: int, dilations: list[int]) -> dict:
    """The numbers of one split computed straight from its Parquet manifest, loop by loop."""
    rows = pq.read_table(out / "manifests" / f"{split}.parquet").to_pylist()
    nf = [r["num_frames"] for r in rows]
    secs = [r["num_frames"] / r["fps"] for r in rows]
    per_class = {c: sum(1 for r in rows if r["label"] == i) for i, c in enumerate(classes)}
    return {
        "videos": len(rows), "classes": len({r["label"] for r in rows}), "frames": sum(nf),
        "hours": sum(secs) / 3600, "bytes": sum(r["jpgs_size"] for r in rows),
        "shard_bytes": sum(os.path.getsize(out / s) for s in {r["shard"] for r in rows}),
        "per_class": per_class,
        "smallest_class": list(sorted(per_class.items(), key=lambda kv: (kv[1], kv[0]))[0]),
        "largest_class": list(sorted(per_class.items(), key=lambda kv: (-kv[1], kv[0]))[0]),
        "too_short": {str(d): sum(1 for n in nf if (frames - 1) * d + 1 > n) for d in dilations},
        "fit_fewer_than_two": sum(1 for n in nf if sum((frames - 1) * d + 1 <= n for d in dilations) < 2),
        "nf": nf, "secs": secs,
    }


def _check_percentiles(got: dict, values: list[float]) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")  # numpy's linear rule, computed independently
    expect = {"p0": min(values), "p100": max(values), "mean": statistics.fmean(values)}
    expect.update({f"p{q}": cuts[q - 1] for q in (10, 25, 50, 75, 90)})
    assert got == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("frames,dilations", [(None, None), (32, [1, 2, 4])])
def test_info_numbers_match_the_manifests(dataset, tmp_path, frames, dilations):
    args = [] if frames is None else ["--frames", str(frames), "--dilations", ",".join(map(str, dilations))]
    rep, stdout = _run_info(dataset, tmp_path, *args)
    frames = frames or LoaderConfig().frames
    dilations = dilations or list(LoaderConfig().dilations)
    info = json.loads((dataset / "dataset.json").read_text())
    assert (rep["frames"], rep["dilations"], rep["num_classes"]) == (frames, dilations, 3)
    assert list(rep["splits"]) == ["train", "test"] and rep["split"] == info["split"]
    total_videos = 0
    for split, got in rep["splits"].items():
        ref = _reference(dataset, split, info["classes"], frames, dilations)
        for key in ("videos", "classes", "frames", "bytes", "shard_bytes", "per_class", "smallest_class",
                    "largest_class", "fit_fewer_than_two"):
            assert got[key] == ref[key], (split, key)
        assert got["hours"] == pytest.approx(ref["hours"], rel=1e-6)
        assert {d: f["too_short"] for d, f in got["dilation_fit"].items()} == ref["too_short"]
        assert {d: f["span"] for d, f in got["dilation_fit"].items()} == {str(d): (frames - 1) * d + 1 for d in dilations}
        _check_percentiles(got["length_frames"], [float(n) for n in ref["nf"]])
        _check_percentiles(got["length_seconds"], ref["secs"])
        total_videos += ref["videos"]
    assert rep["total"]["videos"] == total_videos == 9
    # errors by reason: each broken file's documented reason, plus the duplicate name
    expect = {}
    for reason in [*BROKEN.values(), "duplicate"]:
        expect[reason] = expect.get(reason, 0) + 1
    assert {k: sum(v.values()) for k, v in rep["errors"].items()} == expect
    errors = pq.read_table(dataset / "manifests" / "errors.parquet").to_pylist()
    assert rep["num_errors"] == len(errors) == 7
    per_split = {}
    for e in errors:
        per_split[e["split"]] = per_split.get(e["split"], 0) + 1
    assert {s: sum(v.get(s, 0) for v in rep["errors"].values()) for s in per_split} == per_split
    assert "class balance" in stdout and "too short" in stdout and f"wrote {tmp_path / 'info.png'}" in stdout
    with Image.open(tmp_path / "info.png") as png:
        assert png.format == "PNG" and png.size == (1300, 800)


def test_info_writes_dir_info_png_by_default_and_checks_its_arguments(dataset, tmp_path):
    (dataset / "info.png").unlink(missing_ok=True)
    r = cli("info", str(dataset))
    assert r.returncode == 0, r.stderr
    assert (dataset / "info.png").stat().st_size > 0 and not list(dataset.glob("*.tmp"))
    assert "dilations" in one_error(cli("info", str(dataset), "--dilations", "1,x"))
    assert "--frames 0" in one_error(cli("info", str(dataset), "--frames", "0"))
    assert "dataset.json" in one_error(cli("info", str(tmp_path)))
    assert "data folder" in one_error(cli("info", str(tmp_path / "missing")))


def test_info_help_has_an_example():
    r = cli("info", "--help")
    assert r.returncode == 0 and "Example: moquad info" in r.stdout
