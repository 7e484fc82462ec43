"""Dataset adapters: each official layout -> the expected (video_id, split, label, class) list."""

from __future__ import annotations

import pytest
from test_preprocess_layouts import make_hmdb51, make_k400, make_ssv2, make_ucf101

from moquad.preprocess.datasets import DATASETS, LayoutError, list_dataset, raw_layout, ssv2_label_name


def _by_id(listing):
    return {v.video_id: v for v in listing.videos}


def test_ucf101_lists_splits_labels_and_missing(real_videos_dir, tmp_path):
    expect = make_ucf101(tmp_path, real_videos_dir)
    listing = list_dataset("ucf101", tmp_path, official_split=1)
    assert listing.classes == ["CartWheel", "Wave"]
    got = _by_id(listing)
    assert set(got) | {v.video_id for v in listing.missing} == set(expect)
    assert [v.video_id for v in listing.missing] == ["v_Wave_g99_c01"]
    for vid, v in got.items():
        assert (v.split, v.label, v.class_name) == (expect[vid]["split"], expect[vid]["label"], expect[vid]["class_name"])
        if expect[vid]["path"] is not None:
            assert v.path.resolve() == expect[vid]["path"].resolve()
    with pytest.raises(LayoutError, match="trainlist02"):
        list_dataset("ucf101", tmp_path, official_split=2)
    with pytest.raises(ValueError, match="official splits 1, 2, 3"):
        list_dataset("ucf101", tmp_path, official_split=4)


def test_hmdb51_split_codes(real_videos_dir, tmp_path):
    expect = make_hmdb51(tmp_path, real_videos_dir)
    listing = list_dataset("hmdb51", tmp_path, official_split=1)
    assert listing.classes == ["cartwheel", "wave"]
    got = _by_id(listing)
    assert set(got) == set(expect)  # code 0 (unused) is skipped
    for vid, e in expect.items():
        assert (got[vid].split, got[vid].label, got[vid].class_name) == (e["split"], e["label"], e["class_name"])
    assert not listing.missing


@pytest.mark.parametrize("class_folders", [True, False])
def test_k400_csvs_flat_or_class_folders_and_missing(real_videos_dir, tmp_path, class_folders):
    expect = make_k400(tmp_path, real_videos_dir, class_folders)
    listing = list_dataset("k400", tmp_path)
    assert listing.classes == ["flipping pancake", "segwaying"]
    got = _by_id(listing)
    assert {v.video_id for v in listing.missing} == {"missingXYZ0_000005_000015"}
    assert set(got) == {k for k, e in expect.items() if e["path"] is not None}
    for vid, v in got.items():
        assert (v.split, v.label, v.class_name) == (expect[vid]["split"], expect[vid]["label"], expect[vid]["class_name"])
        assert v.path.resolve() == expect[vid]["path"].resolve()


def test_ssv2_template_normalisation(real_videos_dir, tmp_path):
    assert ssv2_label_name("Putting [something] on [something]") == "Putting something on something"
    expect = make_ssv2(tmp_path, real_videos_dir)
    listing = list_dataset("ssv2", tmp_path)
    got = _by_id(listing)
    assert {k: (v.split, v.label) for k, v in got.items()} == {k: (e["split"], e["label"]) for k, e in expect.items()}
    assert listing.classes[1] == "Pushing something from left to right"


def test_folder_class_dirs_split_dirs_and_csv(real_videos_dir, tmp_path):
    a = tmp_path / "a"
    for cls, clip in (("jump", "part_0.mp4"), ("run", "test.avi"), ("run", "flipping_a_pancake.mkv")):
        (a / cls / "sub").mkdir(parents=True, exist_ok=True)
        (a / cls / "sub" / clip).symlink_to(real_videos_dir / clip)
    (a / "run" / "notes.txt").write_text("not a video")
    listing = list_dataset("folder", a)
    assert listing.classes == ["jump", "run"]
    assert sorted((v.video_id, v.label, v.split) for v in listing.videos) == [
        ("jump/sub/part_0.mp4", 0, "train"), ("run/sub/flipping_a_pancake.mkv", 1, "train"),
        ("run/sub/test.avi", 1, "train")]

    b = tmp_path / "b"
    for split, cls, clip in (("train", "x", "part_0.mp4"), ("val", "y", "test.avi"), ("train", "y", "demo.mp4")):
        (b / split / cls).mkdir(parents=True)
        (b / split / cls / "part_0.mp4").symlink_to(real_videos_dir / clip)
    listing = list_dataset("folder", b)
    assert sorted((v.video_id, v.split, v.class_name) for v in listing.videos) == [
        ("train/x/part_0.mp4", "train", "x"), ("train/y/part_0.mp4", "train", "y"), ("val/y/part_0.mp4", "val", "y")]
    assert listing.split_given and not listing.duplicates
    # one real file under two names is one video; the other path is a duplicate (no train/test leak)
    (b / "val" / "y" / "again.mp4").symlink_to(real_videos_dir / "part_0.mp4")
    listing = list_dataset("folder", b)
    assert len(listing.videos) == 3
    assert [(v.video_id, r) for v, r in listing.duplicates] == [("val/y/again.mp4", f"duplicate of {b / 'train/x/part_0.mp4'}")]

    tsv = tmp_path / "list.tsv"
    tsv.write_text(f"path\tlabel\tsplit\n{real_videos_dir / 'part_0.mp4'}\t3\ttrain\n"
                   f"{real_videos_dir / 'test.avi'}\t1\ttest\nnot_there.mp4\t3\ttest\n")
    listing = list_dataset("folder", tsv)
    assert listing.classes == ["1", "3"]
    assert {(v.split, v.class_name, v.label) for v in listing.videos} == {("train", "3", 1), ("test", "1", 0)}
    assert [v.video_id for v in listing.missing] == ["not_there.mp4"]
    # the same stem with two extensions is two videos
    (a / "jump" / "sub" / "part_0.avi").symlink_to(real_videos_dir / "RATRACE_wave_f_nm_np1_fr_goo_37.avi")
    assert len(list_dataset("folder", a).videos) == 4


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        list_dataset("kinetics", tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_dataset("folder", tmp_path / "nope")
    with pytest.raises(LayoutError, match="no videos found"):
        list_dataset("folder", tmp_path)
    with pytest.raises(LayoutError, match="train.csv"):
        list_dataset("k400", tmp_path)
    with pytest.raises(LayoutError, match="labels.json"):
        list_dataset("ssv2", tmp_path)
    with pytest.raises(LayoutError, match="ucfTrainTestlist"):
        list_dataset("ucf101", tmp_path, official_split=1)
    bad_split = tmp_path / "l.csv"
    bad_split.write_text("a.mp4,x,Train Set\n")
    with pytest.raises(ValueError, match="split name 'Train Set'"):
        list_dataset("folder", bad_split)


@pytest.mark.parametrize("dataset", ["k400", "ucf101", "hmdb51", "ssv2", "folder"])
def test_wrong_layout_error_shows_the_table_layout(tmp_path, dataset):
    """An empty ROOT: the one error line names what is missing and then the layout written in DATASETS."""
    with pytest.raises(LayoutError) as e:
        list_dataset(dataset, tmp_path, official_split=1 if DATASETS[dataset].official_splits else None)
    msg = str(e.value)
    assert msg.endswith(f"; {dataset} expects {DATASETS[dataset].layout}") and "\n" not in msg


def test_the_table_is_the_config_choices():
    from moquad.config import PreprocessConfig
    from moquad.settings import choices

    assert choices(PreprocessConfig, "dataset") == tuple(DATASETS) == ("k400", "ucf101", "hmdb51", "ssv2", "folder")
    assert {n for n, a in DATASETS.items() if a.official_splits} == {"ucf101", "hmdb51"}
    with pytest.raises(ValueError, match="ucf101 has official splits 1, 2, 3; none was given"):
        list_dataset("ucf101", ".")


@pytest.mark.parametrize("files, dataset", [
    (["ucfTrainTestlist/classInd.txt", "UCF-101/Walk/v_Walk_g01_c01.avi"], "ucf101"),
    (["UCF101/ucfTrainTestlist/trainlist01.txt"], "ucf101"),  # its parent folder
    (["ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi"], "ucf101"),  # class folders named as UCF101's, no lists
    (["brush_hair/a_brush_hair_f_nm_np1_ba_goo_0.avi", "testTrainMulti_7030_splits/brush_hair_test_split1.txt"],
     "hmdb51"),
    (["labels/something-something-v2-labels.json", "videos/1.webm"], "ssv2"),
    (["train/abseiling/0347ZoDXyP0_000095_000105.mp4"], "k400"),
    (["walk/clip1.mp4", "run/v_2.avi"], None),  # a folder of one's own videos: `preprocess folder`
])
def test_raw_layout_names_the_dataset_a_folder_holds(tmp_path, files, dataset):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert raw_layout(tmp_path) == dataset
