"""Bad input to preprocess, through the CLI in a subprocess: CSV list mode, a symlink loop in a
folder dataset, a full or read-only disk (one ``error:`` line, rc 2, nothing half-written, resume)."""

from __future__ import annotations

import os
from pathlib import Path

import cli_child as clirun
import pyarrow.parquet as pq
import pytest
from test_preprocess_layouts import pyav_count

SHORT = ["part_0.mp4", "TrumanShow_wave_f_nm_np1_fr_med_26.avi", "RATRACE_wave_f_nm_np1_fr_goo_37.avi",
         "SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi"]
FAST = ["--short-side", "32", "--workers", "1"]


def cli(*args: str, cwd: Path | None = None, driver: str | None = None, env: dict | None = None):
    argv = ["-c", driver, *args] if driver else ["-m", "moquad.cli", *args]
    return clirun.python(*argv, cwd=cwd, env={**os.environ, **(env or {})})


def one_error(result) -> str:
    """The single ``error:`` line of a failed command (rc 2, no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def rows(out: Path) -> dict[str, dict]:
    """video_id -> manifest row, read straight from the Parquet files."""
    got = {}
    for f in sorted((out / "manifests").glob("*.parquet")):
        if f.stem != "errors":
            for r in pq.read_table(f).to_pylist():
                assert r["video_id"] not in got
                got[r["video_id"]] = r
    return got


def errors(out: Path) -> dict[str, str]:
    return {r["video_id"]: r["reason"] for r in pq.read_table(out / "manifests" / "errors.parquet").to_pylist()}


# ---------------------------------------------------------------- CSV / TSV list mode


@pytest.mark.parametrize("sep,suffix", [(",", ".csv"), ("\t", ".tsv")])
def test_csv_list_mode_end_to_end(real_videos_dir, tmp_path, sep, suffix):
    lists = tmp_path / "lists"
    (lists / "clips").mkdir(parents=True)
    for name in SHORT:
        (lists / "clips" / name).symlink_to(real_videos_dir / name)
    table = [("path", "label", "split"), (f"clips/{SHORT[0]}", "pour", "train"), (f"clips/{SHORT[1]}", "wave", "train"),
             (f"clips/{SHORT[2]}", "wave", "test"), (str(real_videos_dir / SHORT[3]), "wave", "train"),
             ("clips/not_there.mp4", "pour", "test")]
    (lists / f"list{suffix}").write_text("".join(sep.join(r) + "\n" for r in table))
    elsewhere = tmp_path / "elsewhere"  # relative paths resolve against the list's folder, not the cwd
    elsewhere.mkdir()
    r = cli("preprocess", "folder", f"../lists/list{suffix}", "--out", str(tmp_path / "o"), *FAST, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "o")
    expect = {f"clips/{SHORT[0]}": ("train", "pour", SHORT[0]), f"clips/{SHORT[1]}": ("train", "wave", SHORT[1]),
              f"clips/{SHORT[2]}": ("test", "wave", SHORT[2]),
              str(real_videos_dir / SHORT[3]).lstrip("/"): ("train", "wave", SHORT[3])}
    assert {k: (v["split"], v["class_name"]) for k, v in got.items()} == {k: e[:2] for k, e in expect.items()}
    for vid, (_, cls, clip) in expect.items():
        assert Path(got[vid]["source_path"]).is_absolute()
        assert Path(got[vid]["source_path"]).resolve() == (real_videos_dir / clip).resolve()
        assert got[vid]["label"] == ["pour", "wave"].index(cls)
        assert got[vid]["num_frames"] == pyav_count(str(real_videos_dir / clip))
    assert errors(tmp_path / "o") == {"clips/not_there.mp4": "missing: listed in the annotations but not found under ROOT"}
    assert cli("verify", str(tmp_path / "o")).returncode == 0


def test_a_file_that_is_not_a_list_is_one_error_line(real_videos_dir, tmp_path):
    line = one_error(cli("preprocess", "folder", str(real_videos_dir / SHORT[0]), "--out", str(tmp_path / "o")))
    assert "not a folder or a .csv/.tsv list" in line
    line = one_error(cli("preprocess", "ucf101", str(real_videos_dir / SHORT[0]), "--out", str(tmp_path / "o")))
    assert "is not a directory" in line


# ---------------------------------------------------------------- symlink loop and aliases


def test_symlink_loop_lists_each_real_file_once(real_videos_dir, tmp_path):
    root = tmp_path / "ds"
    for cls, clips in (("jump", SHORT[:2]), ("run", SHORT[2:])):
        (root / cls).mkdir(parents=True)
        for name in clips:
            (root / cls / name).symlink_to(real_videos_dir / name)
    (root / "jump" / "walk").mkdir()
    (root / "jump" / "walk" / "up").symlink_to("..")  # the loop of the issue
    (root / "jump" / "walk" / "top").symlink_to("../..")  # a loop back to ROOT (would relabel run as jump)
    (root / "run" / "alias").symlink_to("../jump")  # a folder link to another class
    (root / "run" / "again.mp4").symlink_to(real_videos_dir / SHORT[0])  # a second name of one file
    r = cli("preprocess", "folder", str(root), "--out", str(tmp_path / "o"), *FAST)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "o")
    assert {k: v["class_name"] for k, v in got.items()} == {
        f"jump/{SHORT[0]}": "jump", f"jump/{SHORT[1]}": "jump", f"run/{SHORT[2]}": "run", f"run/{SHORT[3]}": "run"}
    assert len({os.path.realpath(v["source_path"]) for v in got.values()}) == 4
    assert errors(tmp_path / "o") == {
        "run/again.mp4": f"duplicate of {root / 'jump' / SHORT[0]}",
        f"run/alias/{SHORT[0]}": f"duplicate of {root / 'jump' / SHORT[0]}",
        f"run/alias/{SHORT[1]}": f"duplicate of {root / 'jump' / SHORT[1]}",
    }
    assert cli("verify", str(tmp_path / "o")).returncode == 0


# ---------------------------------------------------------------- full or read-only disk

# Runs `moquad ...` with the N-th call of os.fsync or TarFile.addfile failing with FAIL_ERRNO,
# the way a disk that fills up mid-run fails (a monkeypatched write: no privileges needed).
DRIVER = """
import errno, os, sys, tarfile
import moquad.cli
what, n, code = os.environ["FAIL_AT"], int(os.environ["FAIL_N"]), getattr(errno, os.environ["FAIL_ERRNO"])
calls = [0]
def failing(real):
    def f(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            raise OSError(code, os.strerror(code))
        return real(*a, **k)
    return f
if what == "fsync":
    os.fsync = failing(os.fsync)
else:
    tarfile.TarFile.addfile = failing(tarfile.TarFile.addfile)
sys.argv = ["moquad", *sys.argv[1:]]
moquad.cli.main()
"""


@pytest.fixture(scope="module")
def small(real_videos_dir, tmp_path_factory):
    """A 2-class folder of 4 short clips and its clean preprocess (the reference)."""
    root = tmp_path_factory.mktemp("disk") / "ds"
    for i, name in enumerate(SHORT):
        (root / ("a" if i % 2 else "b")).mkdir(parents=True, exist_ok=True)
        (root / ("a" if i % 2 else "b") / name).symlink_to(real_videos_dir / name)
    ref = root.parent / "ref"
    assert cli("preprocess", "folder", str(root), "--out", str(ref), *FAST, "--shard-size", "200000").returncode == 0
    return root, ref


def _leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.tmp"))


@pytest.mark.parametrize("at,n,where", [("fsync", 1, "config-000.json"), ("fsync", 2, "shards/train-000-000000.tar"),
                                        ("fsync", 3, "train-000-000000.parquet"), ("addfile", 4, ".tar")])
def test_disk_full_is_one_line_then_the_same_command_resumes(small, tmp_path, at, n, where):
    root, ref = small
    out = tmp_path / "o"
    args = ("preprocess", "folder", str(root), "--out", str(out), *FAST, "--shard-size", "200000")
    r = cli(*args, driver=DRIVER, env={"FAIL_AT": at, "FAIL_N": str(n), "FAIL_ERRNO": "ENOSPC"})
    line = one_error(r)
    assert line.startswith("error: no space left on device while writing ") and where in line, line
    assert " MB free); free space and re-run the same command to resume" in line
    assert "Traceback" not in r.stderr and _leftovers(out) == []
    recorded = {p.stem for p in (out / "manifests" / "_parts").glob("*.parquet")}
    assert {p.stem for p in (out / "shards").glob("*.tar")} <= recorded  # no shard without its record
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    a, b = rows(out), rows(ref)
    assert {k: (v["split"], v["label"], v["checksum"]) for k, v in a.items()} == \
        {k: (v["split"], v["label"], v["checksum"]) for k, v in b.items()}
    assert cli("verify", str(out)).returncode == 0 and _leftovers(out) == []


def test_read_only_output_is_one_line(small, tmp_path):
    root, _ = small
    out = tmp_path / "o"
    r = cli("preprocess", "folder", str(root), "--out", str(out), *FAST, driver=DRIVER,
            env={"FAIL_AT": "fsync", "FAIL_N": "1", "FAIL_ERRNO": "EROFS"})
    line = one_error(r)
    assert line == f"error: read-only file system: cannot write {out / 'manifests/_parts/config-000.json'}; " \
                   "choose a writable output folder"
    assert _leftovers(out) == []
