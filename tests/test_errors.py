"""How messages name a setting: the running command's flag on the command line, the config field from Python."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from moquad import config as C
from moquad.cli import PRETRAIN_FLAGS, app
from moquad.cli_common import flag_names
from moquad.data.epoch_plan import EpochPlan
from moquad.errors import MoquadError, command_flags, setting


def test_a_setting_is_worded_for_python_or_for_the_command():
    assert setting("batch_size", 8) == "batch_size=8"
    assert setting("loader.appearance_op", "rad_intra") == "loader.appearance_op='rad_intra'"
    names = flag_names(C.PretrainConfig, PRETRAIN_FLAGS)
    assert names["epochs"] == "--epochs" and names["loader.seed"] == "--seed"  # --seed also sets loader.seed
    with command_flags(names):
        assert setting("batch_size", 8) == "--batch-size 8"
        assert setting("sync_bn", False) == "--no-sync-bn" and setting("sync_bn", True) == "--sync-bn"
        assert setting("resume", True) == "--resume" and setting("resume", False) == "--set resume=false"
        assert setting("loader.dilations", (1, 4)) == "--set loader.dilations=1,4"  # no flag of its own
        assert setting("loader.augment_on_device", False) == "--augment-on-cpu"
    assert setting("epochs", 25) == "epochs=25"  # the command's wording ends with it


def test_the_batch_advice_names_the_field_from_python_and_the_flag_from_the_command():
    with pytest.raises(MoquadError, match=r"\(5 videos\); use batch_size=4 or less"):
        EpochPlan(5, 4, 2, seed=0, epoch=0)
    with command_flags(flag_names(C.PretrainConfig, PRETRAIN_FLAGS)), \
            pytest.raises(MoquadError, match=r"\(5 videos\); use --batch-size 4 or less"):
        EpochPlan(5, 4, 2, seed=0, epoch=0)


def test_a_command_names_its_flags(tmp_path, monkeypatch):
    """The same failure through ``moquad preprocess`` (its flags) and through Python (its config's fields)."""
    from moquad.preprocess.run import preprocess

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    (tmp_path / "raw" / "a").mkdir(parents=True)
    args = ["preprocess", "folder", str(tmp_path / "raw"), "--out", str(tmp_path / "o"), "--engine", "ray"]
    result = CliRunner().invoke(app, args, prog_name="moquad")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --engine ray needs Ray: pip install 'moquad[ray]' (or use --engine local)"]
    cfg = C.PreprocessConfig(dataset="folder", root=str(tmp_path / "raw"), out=str(tmp_path / "p"), engine="ray")
    with pytest.raises(MoquadError, match=r"^engine='ray' needs Ray: .* \(or use engine='local'\)$"):
        preprocess(cfg, quiet=True)
