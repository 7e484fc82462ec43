"""Each benchmark evaluated on its own splits: the shipped SSv2 and K400 recipes (train / val) run end to end on
small datasets in the official layouts made of the shared real clips; a split without labels is an error.

The expected splits, videos and labels come from the layout files written here, never from the results.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_preprocess_layouts import _link
from typer.testing import CliRunner
from video_fixtures import make_checkpoint

from moquad import config as C
from moquad.cli import app
from moquad.preprocess.run import preprocess

runner = CliRunner()

# short real clips (32-100 frames); per split: (clip, class index); class 0 and 1 in every labelled split
CLIPS = {
    "train": [("part_0.mp4", 0), ("RATRACE_wave_f_nm_np1_fr_goo_37.avi", 1), ("test.avi", 0),
              ("TrumanShow_wave_f_nm_np1_fr_med_26.avi", 1)],
    "val": [("hmdb51_Turnk_r_Pippi_Michel_cartwheel_f_cm_np2_le_med_6.avi", 0),
            ("SchoolRulesHowTheyHelpUs_wave_f_nm_np1_ba_med_0.avi", 1)],
    "test": [("flipping_a_pancake.mkv", None)],  # no labels (SSv2's test split; K400's test.csv here too)
}
SSV2_CLASSES = ["Pushing something from left to right", "Pushing something from right to left"]
K400_CLASSES = ["cartwheeling", "waving"]
# test views and training small enough for seconds on a CPU (the recipes' other settings stand)
SMALL = ["--frames", "4", "--size", "32", "--num-clips", "2", "--set", "crops=1", "--set", "workers=0",
         "--set", "dilation=1", "--set", "batch_size=8"]
TRAIN = {"linear": ["--epochs", "2", "--batch-size", "2"],
         "finetune": ["--epochs", "2", "--batch-size", "2", "--set", "finetune.optimizer=adamw", "--lr", "0.001"]}


def make_ssv2_layout(root: Path, real: Path) -> dict[str, dict[str, int]]:
    """The official SSv2 files (labels, train, validation, test JSON) over ``CLIPS``; -> split -> {id: label}."""
    root.mkdir(parents=True)
    (root / "something-something-v2-labels.json").write_text(json.dumps({c: str(i) for i, c in enumerate(SSV2_CLASSES)}))
    expect: dict[str, dict[str, int]] = {}
    for split, stem in (("train", "train"), ("val", "validation"), ("test", "test")):
        entries = []
        for i, (clip, label) in enumerate(CLIPS[split]):
            vid = f"{len(expect) + 1}{i:02d}"
            _link(real / clip, root / "20bn-something-something-v2" / f"{vid}{Path(clip).suffix}")  # .webm in SSv2
            entry = {"id": vid}
            if label is not None:  # the official test file has ids only
                entry["template"] = SSV2_CLASSES[label].replace("something", "[something]")
            entries.append(entry)
            expect.setdefault(split, {})[vid] = -1 if label is None else label
        (root / f"something-something-v2-{stem}.json").write_text(json.dumps(entries))
    return expect


def make_k400_layout(root: Path, real: Path) -> dict[str, dict[str, int]]:
    """The official K400 CSVs (train, val, and a test.csv without labels) over ``CLIPS``; -> split -> {id: label}."""
    expect: dict[str, dict[str, int]] = {}
    for split, items in CLIPS.items():
        lines = ["label,youtube_id,time_start,time_end,split"]
        for i, (clip, label) in enumerate(items):
            yid = f"{split[:2]}{i:09d}"
            lines.append(f"{'' if label is None else K400_CLASSES[label]},{yid},{i},{i + 10},{split}")
            vid = f"{yid}_{i:06d}_{i + 10:06d}"
            _link(real / clip, root / split / f"{vid}{Path(clip).suffix}")
            expect.setdefault(split, {})[vid] = -1 if label is None else label
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return expect


@pytest.fixture(scope="module", params=["ssv2", "k400"])
def bench(request, real_videos_dir, tmp_path_factory):
    """(dataset, shard folder, expected split -> {video_id: label}, checkpoint), preprocessed once per dataset."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    make = make_ssv2_layout if name == "ssv2" else make_k400_layout
    expect = make(tmp / "raw", real_videos_dir)
    summary = preprocess(C.PreprocessConfig(dataset=name, root=str(tmp / "raw"), out=str(tmp / "shards"),
                                            short_side=40, fps=6.0, jpeg_quality=60, workers=1), quiet=True)
    assert (summary["ok"], summary["failed"], summary["missing"]) == (sum(map(len, CLIPS.values())), 0, 0), summary
    return name, tmp / "shards", expect, make_checkpoint(tmp / "run" / "checkpoints" / "last.pt")


def _run(*args) -> dict:
    result = runner.invoke(app, [*map(str, args)])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("protocol,variant", [("linear", "--fast"), ("linear", "--full"), ("finetune", None)])
def test_shipped_recipe_trains_on_train_and_tests_on_val(bench, protocol, variant, tmp_path):
    name, data, expect, ckpt = bench
    out = tmp_path / "out"
    args = [protocol, *([variant] if variant else []), "--data", data, "--checkpoint", ckpt, "--recipe",
            f"{protocol}_{name}", "--out", out, *SMALL, *([] if variant == "--fast" else TRAIN[protocol])]
    _run(*args)
    stem = {"--fast": "linear_fast", "--full": "linear_cvrl", None: "finetune"}[variant]
    res = json.loads((out / f"{stem}.json").read_text())
    assert res["splits"] == {"train": "train", "test": "val"}
    assert (res["config"]["train_split"], res["config"]["test_split"]) == ("train", "val")
    manifests = res["data"]["manifests"]
    assert {k: v["videos"] for k, v in manifests.items()} == {"train": len(expect["train"]), "val": len(expect["val"])}
    # the numbers are over the val videos: one per class, each counted once in the confusion matrix
    val = expect["val"]
    conf = np.array(res["confusion"])
    assert res["videos"] == len(val) and conf.sum(1).tolist() == np.bincount(list(val.values()), minlength=2).tolist()
    assert res["top1"] == pytest.approx(np.trace(conf) / len(val)) and res["top5"] == 1.0  # 2 classes: top-5 is all
    if protocol == "finetune":
        assert {p["video_id"]: p["label"] for p in res["predictions"]} == val
        assert res["top1"] == pytest.approx(np.mean([p["pred"] == p["label"] for p in res["predictions"]]))
        assert res["protocol"]["train_clip"].endswith("no flip") == (name == "ssv2")  # the recipe's flip setting
    assert "trained on train, tested on val" in (out / f"{stem}.txt").read_text()


@pytest.mark.parametrize("protocol", ["linear", "finetune", "retrieve"])
def test_an_unlabelled_split_is_an_error_line(bench, protocol, tmp_path):
    """The defaults test on 'test', which holds no labels here: one error line naming the flag, exit 2, no result."""
    name, data, _, ckpt = bench
    result = runner.invoke(app, [protocol, "--data", str(data), "--checkpoint", str(ckpt), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "split 'test'" in lines[0], result.output
    assert "has none (0 of 1)" in lines[0] and "--test-split" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing extracted, nothing written
    result = runner.invoke(app, [protocol, "--data", str(data), "--checkpoint", str(ckpt), "--out", str(tmp_path),
                                 "--train-split", "test", "--test-split", "val"])
    assert result.exit_code == 2 and "--train-split" in result.output, result.output


def test_retrieval_queries_the_test_split_it_is_given(bench, tmp_path):
    name, data, expect, ckpt = bench
    _run("retrieve", "--data", data, "--checkpoint", ckpt, "--out", tmp_path, "--test-split", "val", *SMALL,
         "--set", "ks=1,5", "--json", tmp_path / "r.json")
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["splits"] == {"train": "train", "test": "val"}
    assert (res["protocol"]["queries"], res["protocol"]["gallery"]) == ("val", "train")
    assert (res["queries"], res["gallery"]) == (len(expect["val"]), len(expect["train"]))
    assert res["top5"] == 1.0  # 2 classes, every one in the 4-video gallery: a hit within 5


def test_the_motion_report_runs_on_the_real_clips(bench, tmp_path):
    """`moquad motion` on the real clips (SSv2 layout: its built-in pair Pushing left to right / right to left)."""
    name, data, expect, ckpt = bench
    if name != "ssv2":
        pytest.skip("one layout is enough: the report reads any preprocessed split")
    out = tmp_path / "motion"
    _run("motion", "--data", data, f"random={ckpt}", "--split", "train", "--frames", "4", "--size", "32",
         "--knn-k", "1", "--out", out)
    res = json.loads((out / "motion.json").read_text())
    enc = res["encoders"]["random"]
    assert 0.0 <= enc["arrow_of_time_top1"] <= 1.0 and 0.0 <= enc["speed_top1"] <= 1.0
    assert enc["ratio_to_crop"]["reversed"] > 0 and -1.0 <= enc["appearance_share"] <= 1.0
    assert (out / "motion.png").stat().st_size > 10_000 and (out / "motion.txt").is_file()
    pairs = enc["direction_pairs"]  # the built-in SSv2 pair, measured leave-one-out over the 4 train videos (k=1)
    confusion = pairs["pairs"][f"{SSV2_CLASSES[0]} | {SSV2_CLASSES[1]}"]
    assert pairs["mean"] == confusion and (4 * confusion).is_integer() and 0 <= confusion <= 1
