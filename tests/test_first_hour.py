"""The first hour of a new user, each stumble of it a test: what they typed, and the one line that tells them what
to do. Fast (no training, no transcoding) and independent of each other (each test its own tmp_path)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner
from video_fixtures import coded_video, make_checkpoint, write_dataset

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


# ----------------------------------------------------------------------------- --resume


def _printed(*args: str) -> dict:
    import yaml

    result = runner.invoke(app, [*map(str, args), "--print-config"])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


def test_resume_starts_from_the_runs_own_settings_and_flags_still_override(tmp_path):
    """``--out RUN --resume`` is the run's ``config.yaml`` (its recipe's batch, not the default 256), a flag or
    ``--set`` still applies over it, and without ``--resume`` (or without a run there) the defaults stand."""
    from moquad import config as C

    run = tmp_path / "run"
    run.mkdir()
    C.save(C.PretrainConfig(data=str(tmp_path / "data"), out=str(run), backbone="tiny", batch_size=8, lr=0.05,
                            loader=C.LoaderConfig(frames=4, size=32)), run / "config.yaml")
    got = _printed("pretrain", "--out", run, "--resume")
    assert (got["data"], got["backbone"], got["batch_size"], got["lr"], got["loader"]["size"], got["resume"]) == (
        str(tmp_path / "data"), "tiny", 8, 0.05, 32, True)
    got = _printed("pretrain", "--out", run, "--resume", "--log-every", "5", "--set", "loader.workers=0")
    assert (got["log_every"], got["loader"]["workers"], got["batch_size"]) == (5, 0, 8)
    assert _printed("pretrain", "--data", tmp_path, "--out", run)["batch_size"] == 256  # no --resume: a new run
    assert _printed("pretrain", "--data", tmp_path, "--out", tmp_path / "new", "--resume")["batch_size"] == 256
    line = _one_error(runner.invoke(app, ["pretrain", "--out", str(tmp_path / "new")]))  # a new run needs data
    assert line == "error: pretrain needs --data DIR, the --out folder of `moquad preprocess`"
    (run / "config.yaml").write_text("epochz: 3\n")
    line = _one_error(runner.invoke(app, ["pretrain", "--out", str(run), "--resume"]))
    assert f"cannot resume {run}: its settings ({run / 'config.yaml'}) do not load: unknown setting 'epochz' (did " \
           "you mean epochs?)" in line


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, Path]:
    """A one-epoch run of ``moquad pretrain`` with a recipe (batch 4 of 8 coded videos), on the CPU."""
    tmp = tmp_path_factory.mktemp("resume")
    data = tmp / "data"
    write_dataset(data, [(f"v{v}", coded_video(v, 12, 24, 24), v % 2) for v in range(8)], videos_per_shard=4)
    recipe = tmp / "tiny.yaml"
    recipe.write_text("backbone: tiny\nproj_dim: 8\nproj_hidden: 16\nepochs: 1\nbatch_size: 4\nlr: 0.05\n"
                      "device: cpu\nloader:\n  frames: 4\n  size: 16\n  dilations: [1, 2]\n  workers: 0\n")
    run = tmp / "run"
    result = runner.invoke(app, ["pretrain", "--data", str(data), "--out", str(run), "--recipe", str(recipe)])
    assert result.exit_code == 0, result.output
    return data, run


def test_resume_continues_a_recipe_run_with_its_settings(trained_run):
    """After a run with a recipe, ``--resume`` with only --data and --out continues it (here: nothing left to
    train) instead of failing on the default batch of 256 videos."""
    data, run = trained_run
    result = runner.invoke(app, ["pretrain", "--data", str(data), "--out", str(run), "--resume"])
    assert result.exit_code == 0, result.output
    assert f"resuming from {run / 'checkpoints' / 'last.pt'} at step 2 of 2: all 1 epochs are done" in result.output


def test_resume_with_a_changed_setting_is_refused_in_one_line(trained_run):
    data, run = trained_run
    line = _one_error(runner.invoke(app, ["pretrain", "--out", str(run), "--resume", "--lr", "0.5"]))
    assert line == (f"error: cannot resume {run / 'checkpoints' / 'last.pt'}: settings changed (lr: 0.05 -> 0.5); "
                    "use the original settings or a new --out")


# ----------------------------------------------------------------------------- did you mean


@pytest.mark.parametrize("args, guess", [
    (["pretrain", "--data", "{tmp}", "--set", "loader.dilation=1,4"], "'loader.dilation' (did you mean loader.dilations?)"),
    (["pretrain", "--data", "{tmp}", "--set", "dilation=1,4"], "'dilation' (did you mean loader.dilations?)"),
    (["pretrain", "--data", "{tmp}", "--set", "epoch=3"], "'epoch' (did you mean epochs?)"),
    (["retrieve", "--data", "{tmp}", "--checkpoint", "{tmp}/c.pt", "--set", "knnk=5"], "'knnk' (did you mean knn_k?)"),
    (["pretrain", "--data", "{tmp}", "--recipe", "{tmp}/r.yaml"], "'lr_warmup' (did you mean lr_warmup_epochs?)"),
])
def test_an_unknown_setting_says_which_one_was_meant(tmp_path, args, guess):
    """A typo in a setting names the setting it most likely meant, before the list of every valid one."""
    (tmp_path / "r.yaml").write_text("lr_warmup: 3\n")
    line = _one_error(runner.invoke(app, [a.format(tmp=tmp_path) for a in args] + ["--print-config"]))
    assert f"unknown setting {guess}; valid: " in line


def test_no_guess_when_nothing_is_close():
    from moquad import config as C
    from moquad.settings import did_you_mean

    cfg = C.PretrainConfig()
    assert [did_you_mean(cfg, k) for k in ("nope", "loader.nope", "epochs.x", "loader.seeds", "Epochs")] == [
        None, None, None, "loader.seed", "epochs"]


# ----------------------------------------------------------------------------- --checkpoint everywhere


def test_every_command_that_reads_a_checkpoint_takes_checkpoint_option():
    """retrieve and linear require ``--checkpoint``, so every command that reads one accepts it: export (also
    positional, as before) and motion (its encoders, also positional) too."""
    import typer

    group = typer.main.get_command(app)
    readers = []
    for name in group.list_commands(None):
        params = group.get_command(None, name).params
        if any(p.name in ("checkpoint", "encoders") for p in params):
            readers.append(name)
            assert any("--checkpoint" in p.opts for p in params), name
    assert {"extract", "retrieve", "linear", "attentive", "finetune", "cam", "export", "motion"} <= set(readers)


def test_export_takes_the_checkpoint_either_way(tmp_path):
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    for i, how in enumerate((["--checkpoint", str(ckpt)], [str(ckpt)], [str(ckpt), "--checkpoint", str(ckpt)])):
        out = tmp_path / f"tiny{i}.safetensors"
        result = runner.invoke(app, ["export", *how, "--format", "safetensors", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert out.stat().st_size > 0 and out.with_suffix(".json").is_file()
    line = _one_error(runner.invoke(app, ["export", str(ckpt), "--checkpoint", str(tmp_path / "b.pt"), "--out",
                                          str(tmp_path / "x.safetensors")]))
    assert line == f"error: CHECKPOINT {ckpt} and --checkpoint {tmp_path / 'b.pt'} differ; give one of them"
    line = _one_error(runner.invoke(app, ["export", "--out", str(tmp_path / "x.safetensors")]))
    assert line == "error: missing CHECKPOINT (or --checkpoint CHECKPOINT)"


# ----------------------------------------------------------------------------- Python calls and result files


def test_python_calls_never_silently_replace_a_commands_result_and_can_be_quiet(tmp_path, capsys):
    """``moquad retrieve`` wrote RUN/eval/retrieval.json; ``moquad.retrieve(ev)`` refuses to replace it (before any
    work) and says how, ``overwrite=True`` replaces it, ``quiet=True`` prints no table; the same for linear. A
    command run again still replaces its own result, as it says."""
    import json

    from test_features import make_tiny_dataset

    import moquad
    from moquad.errors import MoquadError

    data = make_tiny_dataset(tmp_path / "data", {"train": 6, "test": 4}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    small = ["--num-clips", "1", "--frames", "4", "--size", "32", "--set", "workers=0", "--set", "ks=1,5",
             "--device", "cpu"]
    result = runner.invoke(app, ["retrieve", "--data", str(data), "--checkpoint", str(ckpt), *small])
    assert result.exit_code == 0, result.output
    written = tmp_path / "run" / "eval" / "retrieval.json"
    before = written.read_bytes()
    ev = moquad.EvalConfig(data=str(data), checkpoint=str(ckpt), num_clips=1, frames=4, size=32, workers=0, ks=(1, 5),
                           device="cpu")
    capsys.readouterr()
    with pytest.raises(MoquadError) as e:
        moquad.retrieve(ev)
    assert str(e.value) == (f"{written} exists (a result written earlier); pass overwrite=True to replace it, or set "
                            "EvalConfig.out to write the result elsewhere")
    assert written.read_bytes() == before
    res = moquad.retrieve(ev, quiet=True, overwrite=True)
    assert capsys.readouterr().out == ""  # no table
    assert json.loads(written.read_text())["top1"] == res["top1"] == json.loads(before)["top1"]
    moquad.linear(ev, quiet=True)
    assert capsys.readouterr().out == "" and (tmp_path / "run" / "eval" / "linear_fast.json").is_file()
    with pytest.raises(MoquadError, match="linear_fast.json exists"):
        moquad.linear(ev)
    moquad.linear(ev, overwrite=True)
    assert "linear probe (linear_fast)" in capsys.readouterr().out  # not quiet: the tables
    result = runner.invoke(app, ["retrieve", "--data", str(data), "--checkpoint", str(ckpt), *small])
    assert result.exit_code == 0 and f"wrote {written}" in result.output
    # fine-tuning: the same rule, asked before any training
    ft = dataclasses.replace(ev, finetune=dataclasses.replace(ev.finetune, epochs=1, batch_size=2, optimizer="adamw",
                                                                lr=1e-3))
    moquad.finetune(ft, quiet=True)
    tuned = tmp_path / "run" / "eval" / "finetune.json"
    assert capsys.readouterr().out == "" and tuned.is_file()
    before = tuned.read_bytes()
    with pytest.raises(MoquadError, match="finetune.json exists"):
        moquad.finetune(ft)
    assert tuned.read_bytes() == before
