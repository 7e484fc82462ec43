"""Builders for dataset layouts made of the real clips plus generated broken files.

Imported by the other preprocess tests; the tests here check the builders' reference values.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import av

from moquad.preprocess.transcode import ffmpeg_exe

# small, fast real clips with their quirks: B-frame AVIs with non-monotonic pts, invalid UTF-8
# metadata (hmdb51_*), audio tracks (test.avi mp3, pancake opus, R6ll aac), avi/mp4/mkv
CLIPS = [
    "v_SoccerJuggling_g23_c01.avi",
    "RATRACE_wave_f_nm_np1_fr_goo_37.avi",
    "TrumanShow_wave_f_nm_np1_fr_med_26.avi",
    "hmdb51_Turnk_r_Pippi_Michel_cartwheel_f_cm_np2_le_med_6.avi",
    "part_0.mp4",
    "test.avi",
    "flipping_a_pancake.mkv",
    "SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi",
]

# broken file name -> start of the reason preprocess must record
BROKEN = {
    "garbage.mp4": "unreadable",
    "empty.avi": "unreadable",
    "truncated.avi": "truncated",
    "audio_only.mp4": "audio-only",
    "zero_frames.avi": "zero frames",
    "wrong_ext.avi": "wrong extension",
}


@functools.cache
def pyav_count(path: str) -> int:
    """Independent reference: number of frames PyAV decodes from the first video stream."""
    with av.open(path, metadata_errors="replace") as c:
        return sum(1 for _ in c.decode(c.streams.video[0]))


def _ff(*args: str) -> None:
    subprocess.run([ffmpeg_exe(), "-y", "-v", "error", "-nostdin", *args], check=True)


def make_broken(folder: Path, real: Path) -> dict[str, Path]:
    """Write every file of :data:`BROKEN` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {name: folder / name for name in BROKEN}
    out["garbage.mp4"].write_bytes(bytes(range(256)) * 20)
    out["empty.avi"].write_bytes(b"")
    data = (real / "v_SoccerJuggling_g24_c01.avi").read_bytes()
    out["truncated.avi"].write_bytes(data[: len(data) // 3])
    _ff("-f", "lavfi", "-i", "sine=d=0.5", "-c:a", "aac", str(out["audio_only.mp4"]))
    _ff("-f", "lavfi", "-i", "testsrc=s=64x48:r=25:d=1", "-vf", "trim=start_frame=1000", "-c:v", "mpeg4",
        str(out["zero_frames.avi"]))
    out["wrong_ext.avi"].write_bytes((real / "part_0.mp4").read_bytes())  # an MP4 named .avi
    return out


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)
    return dst


def make_ucf101(root: Path, real: Path, with_broken: bool = True) -> dict[str, dict]:
    """UCF101 layout: 2 classes x 4 clips (+ broken files, + one listed-but-missing video).

    Returns video_id -> {"split", "label", "class_name", "path", "broken"(reason prefix or None)}.
    """
    classes = ["CartWheel", "Wave"]
    expect: dict[str, dict] = {}
    lines = {"train": [], "test": []}
    for i, name in enumerate(CLIPS):
        cls = classes[i % 2]
        split = "test" if i in (2, 3) else "train"
        ext = Path(name).suffix
        vid = f"v_{cls}_g{i:02d}_c01"
        _link(real / name, root / "UCF-101" / cls / f"{vid}{ext}")
        lines[split].append((f"{cls}/{vid}{ext}", classes.index(cls)))
        expect[vid] = dict(split=split, label=classes.index(cls), class_name=cls, path=real / name, broken=None)
    if with_broken:
        broken = make_broken(root / "_broken", real)
        for j, (fname, reason) in enumerate(BROKEN.items()):
            cls = classes[j % 2]
            vid = f"v_{cls}_g{50 + j:02d}_c01"
            ext = Path(fname).suffix
            (root / "UCF-101" / cls).mkdir(parents=True, exist_ok=True)
            broken[fname].rename(root / "UCF-101" / cls / f"{vid}{ext}")
            lines["train"].append((f"{cls}/{vid}{ext}", classes.index(cls)))
            expect[vid] = dict(split="train", label=classes.index(cls), class_name=cls, path=None, broken=reason)
        lines["test"].append(("Wave/v_Wave_g99_c01.avi", 1))  # listed, not on disk
        expect["v_Wave_g99_c01"] = dict(split="test", label=1, class_name="Wave", path=None, broken="missing")
    lists = root / "ucfTrainTestlist"
    lists.mkdir(parents=True)
    (lists / "classInd.txt").write_text("".join(f"{i + 1} {c}\n" for i, c in enumerate(classes)))
    (lists / "trainlist01.txt").write_text("".join(f"{p} {label + 1}\n" for p, label in lines["train"]))
    (lists / "testlist01.txt").write_text("".join(f"{p}\n" for p, _ in lines["test"]))
    return expect


def make_hmdb51(root: Path, real: Path) -> dict[str, dict]:
    """HMDB51 layout: wave / cartwheel folders, split 1 files with 1 (train), 2 (test), 0 (unused)."""
    spec = {
        "cartwheel": [("hmdb51_Turnk_r_Pippi_Michel_cartwheel_f_cm_np2_le_med_6.avi", 1), ("part_0.mp4", 2)],
        "wave": [("RATRACE_wave_f_nm_np1_fr_goo_37.avi", 1), ("TrumanShow_wave_f_nm_np1_fr_med_26.avi", 2),
                 ("SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi", 0)],
    }
    split_dir = root / "testTrainMulti_7030_splits"
    split_dir.mkdir(parents=True)
    expect = {}
    for label, (cls, items) in enumerate(sorted(spec.items())):
        lines = []
        for name, code in items:
            fname = name if name.startswith(("hmdb", "RAT", "Tru", "Sch")) else f"clip_{cls}_{name}"
            _link(real / name, root / cls / fname)
            lines.append(f"{fname} {code} \n")
            if code:
                expect[Path(fname).stem] = dict(split="train" if code == 1 else "test", label=label, class_name=cls,
                                                path=real / name)
        (split_dir / f"{cls}_test_split1.txt").write_text("".join(lines))
        (split_dir / f"{cls}_test_split2.txt").write_text("".join(lines[::-1]))
    return expect


def make_k400(root: Path, real: Path, class_folders: bool = True) -> dict[str, dict]:
    """K400 layout: annotations/{train,val}.csv; videos in class folders (or flat); one missing."""
    rows = {
        "train": [("flipping pancake", "pancakeAAA1", 0, 10, "flipping_a_pancake.mkv"),
                  ("segwaying", "R6llTwEh07w", 2, 12, "part_0.mp4"),
                  ("segwaying", "missingXYZ0", 5, 15, None)],
        "val": [("flipping pancake", "valpancake1", 1, 11, "test.avi")],
    }
    (root / "annotations").mkdir(parents=True)
    classes = ["flipping pancake", "segwaying"]
    expect = {}
    for split, items in rows.items():
        lines = ["label,youtube_id,time_start,time_end,split"]
        for label, yid, t0, t1, clip in items:
            lines.append(f'"{label}",{yid},{t0},{t1},{split}')
            vid = f"{yid}_{t0:06d}_{t1:06d}"
            if clip:
                folder = root / split / label.replace(" ", "_") if class_folders else root / split
                _link(real / clip, folder / f"{vid}{Path(clip).suffix}")
            expect[vid] = dict(split=split, label=classes.index(label), class_name=label,
                               path=real / clip if clip else None)
        (root / "annotations" / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return expect


def make_ssv2(root: Path, real: Path) -> dict[str, dict]:
    """SSv2 layout: <id>.webm (here the mkv clip renamed, same container family) + the JSON files."""
    root.mkdir(parents=True, exist_ok=True)
    labels = {"Holding something next to something": "0", "Pushing something from left to right": "1"}
    (root / "something-something-v2-labels.json").write_text(json.dumps(labels))
    train = [{"id": "101", "label": "holding a cup next to a box", "template": "Holding [something] next to [something]",
              "placeholders": ["a cup", "a box"]},
             {"id": "102", "label": "pushing pen from left to right",
              "template": "Pushing [something] from left to right", "placeholders": ["pen"]}]
    val = [{"id": "201", "label": "pushing x", "template": "Pushing [something] from left to right",
            "placeholders": ["x"]}]
    (root / "something-something-v2-train.json").write_text(json.dumps(train))
    (root / "something-something-v2-validation.json").write_text(json.dumps(val))
    vids = root / "20bn-something-something-v2"
    for vid in ("101", "102", "201"):
        _link(real / "flipping_a_pancake.mkv", vids / f"{vid}.webm")
    return {"101": dict(split="train", label=0), "102": dict(split="train", label=1), "201": dict(split="val", label=1)}


def test_reference_counts_are_the_documented_ones(real_videos_dir):
    # SOURCES.md: frames decoded by PyAV 18.1
    assert pyav_count(str(real_videos_dir / "RATRACE_wave_f_nm_np1_fr_goo_37.avi")) == 72
    assert pyav_count(str(real_videos_dir / "part_0.mp4")) == 32


def test_make_ucf101_writes_the_official_list_format(real_videos_dir, tmp_path):
    expect = make_ucf101(tmp_path, real_videos_dir)
    assert (tmp_path / "ucfTrainTestlist" / "classInd.txt").read_text().startswith("1 CartWheel\n")
    assert sum(1 for e in expect.values() if e["broken"] is None) == len(CLIPS)
