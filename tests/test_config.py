"""Config precedence: defaults < recipe < CLI flags; typos are errors."""

from __future__ import annotations

import pytest
import yaml

from moquad import config as C


def test_resolve_precedence(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"epochs": 800, "batch_size": 256, "loader": {"frames": 16, "rad_k": 5}}))
    cfg = C.resolve(C.PretrainConfig(), recipe, {"epochs": 3, "batch_size": None, "loader.frames": 8})
    assert cfg.epochs == 3  # flag beats recipe
    assert cfg.batch_size == 256  # recipe beats default, None flag ignored
    assert cfg.loader.frames == 8 and cfg.loader.rad_k == 5
    assert cfg.loader.crop_scale == C.LoaderConfig().crop_scale  # untouched nested default


def test_unknown_key_is_an_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("epoch: 10\n")
    with pytest.raises(ValueError, match="unknown setting 'epoch'"):
        C.resolve(C.PretrainConfig(), recipe, {})


def test_missing_recipe(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe"):
        C.resolve(C.PretrainConfig(), tmp_path / "nope.yaml", {})


def test_save_roundtrip(tmp_path):
    cfg = C.update(C.PretrainConfig(), {"loader": {"dilations": [1, 3]}, "lr": 0.5})
    C.save(cfg, tmp_path / "c.yaml")
    back = C.update(C.PretrainConfig(), yaml.safe_load((tmp_path / "c.yaml").read_text()))
    assert back == cfg and back.loader.dilations == (1, 3)
