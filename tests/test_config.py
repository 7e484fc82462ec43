"""Config precedence: defaults < recipe < CLI flags; typos are errors."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from moquad import config as C
from moquad import settings
from moquad.errors import MoquadError
from moquad.recipes import RECIPE_ROOT, find_recipe, load_recipe


def test_resolve_precedence(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"epochs": 800, "batch_size": 256, "loader": {"frames": 16, "rad_k": 5}}))
    cfg = settings.resolve(C.PretrainConfig(), recipe, {"epochs": 3, "batch_size": None, "loader.frames": 8})
    assert cfg.epochs == 3  # flag beats recipe
    assert cfg.batch_size == 256  # recipe beats default, None flag ignored
    assert cfg.loader.frames == 8 and cfg.loader.rad_k == 5
    assert cfg.loader.crop_scale == C.LoaderConfig().crop_scale  # untouched nested default


def test_unknown_key_is_an_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("epoch: 10\n")
    with pytest.raises(ValueError, match=r"unknown setting 'epoch' \(did you mean epochs\?\); valid: backbone, "
                                         r"batch_size, ckpt_every,"):
        settings.resolve(C.PretrainConfig(), recipe, {})


def test_missing_recipe(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe"):
        settings.resolve(C.PretrainConfig(), tmp_path / "nope.yaml", {})


def test_save_roundtrip(tmp_path):
    cfg = C.update(C.PretrainConfig(), {"loader": {"dilations": [1, 3]}, "lr": 0.5})
    C.save(cfg, tmp_path / "c.yaml")
    back = C.update(C.PretrainConfig(), yaml.safe_load((tmp_path / "c.yaml").read_text()))
    assert back == cfg and back.loader.dilations == (1, 3)


# ----------------------------------------------------------------------------- one checker for every field


@pytest.mark.parametrize("kind", [C.PreprocessConfig, C.LoaderConfig, C.PretrainConfig, C.EvalConfig])
def test_defaults_pass_the_checker(kind):
    cfg = kind()
    C.check(cfg)
    assert C.update(cfg, {}) == cfg


def test_allowed_coercions_only():
    cfg = C.update(C.PretrainConfig(), {"lr": 3, "loader": {"dilations": [1, 3], "rad_lambda": [0, 1]}})
    assert cfg.lr == 3.0 and type(cfg.lr) is float  # int -> float
    assert cfg.loader.dilations == (1, 3) and cfg.loader.rad_lambda == (0.0, 1.0)  # list -> tuple, ints -> floats
    assert C.PretrainConfig(loader={"size": 32}).loader == C.LoaderConfig(size=32)  # dict -> nested config
    for key, value, message in [
        ("lr", "0.1", "lr must be a number, got '0.1'"),  # a quoted YAML string is not a number
        ("epochs", 3.0, "epochs must be an int, got 3.0"),  # no float -> int
        ("epochs", True, "epochs must be an int, got True"),  # bool is not an int
        ("sync_bn", 1, "sync_bn must be true or false, got 1"),
        ("batch_size", 0, "batch_size must be >= 1, got 0"),
        ("lr", 0, "lr must be > 0, got 0.0"),
        ("warmup_ratio", -0.1, "warmup_ratio must be >= 0, got -0.1"),
        ("temperature", float("inf"), "temperature must be a finite number, got inf"),
        ("steps_per_epoch", "none", "steps_per_epoch must be an int, got 'none'"),
        ("loader", [1], "loader must be a mapping of LoaderConfig settings, got [1]"),
    ]:
        with pytest.raises(C.ConfigError, match=re.escape(message)):
            C.update(C.PretrainConfig(), {key: value})
    assert C.update(C.PretrainConfig(), {"steps_per_epoch": None}).steps_per_epoch is None


@pytest.mark.parametrize("values, message", [
    ({"dilations": []}, "loader.dilations must be a list of ints, got []"),
    ({"dilations": 2}, "loader.dilations must be a list of ints, got 2"),
    ({"dilations": [1, 0]}, "loader.dilations must be >= 1, got 0"),
    ({"crop_scale": [0.5]}, "loader.crop_scale must be a list of 2 numbers, got [0.5]"),
    ({"crop_scale": [0.0, 1.0]}, "loader.crop_scale must be > 0, got 0.0"),
    ({"crop_scale": [0.8, 0.5]}, "loader.crop_scale must not decrease (low, high), got [0.8, 0.5]"),
    ({"rad_lambda": [0.1, 1.5]}, "loader.rad_lambda must be <= 1, got 1.5"),
    ({"color_jitter": 2}, "loader.color_jitter must be <= 1, got 2.0"),
    ({"workers": -1}, "loader.workers must be >= 0, got -1"),
])
def test_nested_settings_checked_with_their_dotted_name(values, message):
    with pytest.raises(C.ConfigError, match=re.escape(message)):
        C.update(C.PretrainConfig(), {"loader": values})


def test_checked_however_the_config_is_built():
    with pytest.raises(C.ConfigError, match="crops must be one of 1, 3, got 2"):
        C.EvalConfig(crops=2)
    with pytest.raises(C.ConfigError, match="test_split must differ from train_split"):
        dataclasses.replace(C.EvalConfig(), test_split="train")
    with pytest.raises(C.ConfigError, match=re.escape("part must be below num_parts (2), got 2")):
        C.PreprocessConfig(num_parts=2, part=2)


def test_a_new_field_needs_only_its_annotation():
    """The checker is generic: a config class with new fields is checked from annotations and metadata alone."""

    @dataclasses.dataclass
    class NewLoader:
        verify_checksums: bool = True
        max_bad_fraction: float = C.rule(0.01, ge=0, le=1)
        names: tuple[str, ...] = ("a",)

        def __post_init__(self):
            C.check(self)

    assert C.update(NewLoader(), {"max_bad_fraction": 0, "names": ["b", "c"]}) == NewLoader(True, 0.0, ("b", "c"))
    with pytest.raises(C.ConfigError, match="verify_checksums must be true or false, got 'yes'"):
        NewLoader(verify_checksums="yes")
    with pytest.raises(C.ConfigError, match="max_bad_fraction must be <= 1, got 2.0"):
        NewLoader(max_bad_fraction=2)
    assert C.parse_sets(NewLoader(), ["verify_checksums=no", "names=x,y"]) == {"verify_checksums": False,
                                                                             "names": ("x", "y")}


def test_parse_text_by_annotation():
    cfg = C.PretrainConfig()
    assert C.parse_sets(cfg, ["loader.dilations=1,4", "loader.crop_scale=[0.6, 1.0]", "lr=0.1", "epochs=3",
                              "sync_bn=true", "steps_per_epoch=none", "split=val", "loader.flip=none"]) == {
        "loader": {"dilations": (1, 4), "crop_scale": (0.6, 1.0), "flip": "none"}, "lr": 0.1, "epochs": 3,
        "sync_bn": True, "steps_per_epoch": None, "split": "val"}
    for item, message in [("epochs=1.5", "epochs must be an int, got '1.5'"),
                          ("sync_bn=maybe", "sync_bn must be true or false, got 'maybe'"),
                          ("nope=1", "unknown setting 'nope'; valid: backbone, batch_size,"),
                          ("loader.nope=1", "unknown setting 'loader.nope'; valid: loader.ad_intra_neg,"),
                          ("=3", "must look like KEY=VALUE")]:
        with pytest.raises(C.ConfigError, match=re.escape(message)):
            C.parse_sets(cfg, [item])


def test_set_wins_over_a_named_flag():
    cfg = settings.resolve(C.PretrainConfig(), None, {"epochs": 5, "loader.size": 64}, ["epochs=7"])
    assert (cfg.epochs, cfg.loader.size) == (7, 64)


def test_recipe_floats_in_exponent_form(tmp_path):
    """PyYAML reads ``1e-6`` as a string (YAML 1.1); recipes read it as the number it is. Quoted stays a string."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("weight_decay: 1e-6\nlr: 2.5E+0\n")
    cfg = settings.resolve(C.PretrainConfig(), recipe, {})
    assert (cfg.weight_decay, cfg.lr) == (1e-6, 2.5)
    recipe.write_text("weight_decay: '1e-6'\n")
    with pytest.raises(C.ConfigError, match=re.escape("weight_decay must be a number, got '1e-6' (in recipe")):
        settings.resolve(C.PretrainConfig(), recipe, {})


def test_recipe_errors(tmp_path):
    (tmp_path / "bad.yaml").write_text("a: 1\n  b: [\n")
    with pytest.raises(MoquadError, match=r"recipe .*bad.yaml line \d+: "):
        load_recipe(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(MoquadError, match="must be a YAML mapping"):
        load_recipe(tmp_path / "list.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MoquadError, match="is not a text file"):
        load_recipe(tmp_path / "bin.yaml")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: a.yaml\n")
    with pytest.raises(MoquadError, match=re.escape("(a.yaml -> b.yaml -> c.yaml -> a.yaml)")):
        load_recipe(tmp_path / "a.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_recipe(tmp_path / "empty.yaml") == {}


def test_recipes_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("train/cpu_demo.yaml") == RECIPE_ROOT / "train" / "cpu_demo.yaml"
    assert settings.resolve(C.PretrainConfig(), "train/cpu_demo.yaml", {}).backbone == "tiny"
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "cpu_demo.yaml").write_text("epochs: 3\n")  # a local file of that name comes first
    assert settings.resolve(C.PretrainConfig(), "train/cpu_demo.yaml", {}).epochs == 3


@pytest.mark.parametrize("kind, values, key, table", [  # the wrong value is the last word of values
    (C.PretrainConfig, {"backbone": "resnet"}, "backbone", "moquad.models.backbones:BACKBONES"),
    (C.PretrainConfig, {"model_input": "flow"}, "model_input", "moquad.models.backbones:INPUTS"),
    (C.PretrainConfig, {"method": "byol"}, "method", "moquad.train.methods:METHODS"),
    (C.PretrainConfig, {"loader": {"appearance_op": "blur"}}, "loader.appearance_op", "moquad.data.ops:APPEARANCE_OPS"),
    (C.PretrainConfig, {"loader": {"motion_ops": ["speed", "jump"]}}, "loader.motion_ops", "moquad.data.ops:MOTION_OPS"),
    (C.PretrainConfig, {"loader": {"flip": "sometimes"}}, "loader.flip", "moquad.data.ops:FLIP_POLICIES"),
    (C.PreprocessConfig, {"dataset": "kinetics"}, "dataset", "moquad.preprocess.datasets:DATASETS"),
    (C.PreprocessConfig, {"engine": "slurm"}, "engine", "moquad.preprocess.engines:ENGINES"),
    (C.EvalConfig, {"finetune": {"backbone": "resnet"}}, "finetune.backbone", "moquad.models.backbones:BACKBONES"),
    (C.PretrainConfig, {"optimizer": "adam9"}, "optimizer", "moquad.train.optimizers:OPTIMIZERS"),
    (C.EvalConfig, {"linear": {"optimizer": "adam9"}}, "linear.optimizer", "moquad.train.optimizers:OPTIMIZERS"),
    (C.EvalConfig, {"finetune": {"optimizer": "adam9"}}, "finetune.optimizer", "moquad.train.optimizers:OPTIMIZERS"),
])
def test_table_choices_checked_when_resolved(kind, values, key, table, tmp_path):
    """A setting that names a table row is checked against the owner's table, from flags and from a recipe."""
    import importlib

    module, name = table.split(":")
    bad = re.findall(r"\w+", str(values))[-1]
    names = ", ".join(getattr(importlib.import_module(module), name))
    message = f"{key} must be one of {names}, got {bad!r}"
    with pytest.raises(C.ConfigError, match=re.escape(message)):
        settings.resolve(kind(), None, values)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(values))
    with pytest.raises(C.ConfigError, match=re.escape(message) + ".* \\(in recipe "):
        settings.resolve(kind(), recipe, {})


def test_choices_are_the_owners_tables():
    from moquad.data.ops import APPEARANCE_OPS, FLIP_POLICIES, MOTION_OPS
    from moquad.models.backbones import BACKBONES, INPUTS
    from moquad.preprocess.datasets import DATASETS
    from moquad.preprocess.engines import ENGINES
    from moquad.train.methods import METHODS
    from moquad.train.optimizers import OPTIMIZERS

    tables = {(C.PretrainConfig, "backbone"): BACKBONES, (C.PretrainConfig, "model_input"): INPUTS,
              (C.FinetuneConfig, "backbone"): BACKBONES, (C.LoaderConfig, "appearance_op"): APPEARANCE_OPS,
              (C.LoaderConfig, "motion_ops"): MOTION_OPS, (C.LoaderConfig, "flip"): FLIP_POLICIES,
              (C.PreprocessConfig, "dataset"): DATASETS, (C.PreprocessConfig, "engine"): ENGINES,
              (C.PretrainConfig, "method"): METHODS, (C.PretrainConfig, "optimizer"): OPTIMIZERS,
              (C.LinearConfig, "optimizer"): OPTIMIZERS, (C.FinetuneConfig, "optimizer"): OPTIMIZERS,
              (C.AttentiveConfig, "optimizer"): OPTIMIZERS}
    assert {key: settings.choices(*key) for key in tables} == {key: tuple(t) for key, t in tables.items()}
    for kind in (C.PretrainConfig, C.PreprocessConfig, C.EvalConfig):
        settings.check_choices(kind())  # every default is a row of its table


def test_config_imports_no_stage():
    """moquad.config sits below every stage (they import it): importing it loads no data, model or preprocess
    module, and the modules that hold the tables do not import moquad.settings."""
    import subprocess
    import sys

    code = ("import sys, moquad.config, moquad.data.ops, moquad.models.backbones, moquad.preprocess.engines; "
            "print(sorted(m for m in sys.modules if m.startswith('moquad.')))")
    out = subprocess.run([sys.executable, "-c", "import sys, moquad.config; print(sorted(m for m in sys.modules "
                          "if m.startswith('moquad.')))"], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["moquad.config", "moquad.errors"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "moquad.settings" not in eval(out)
