"""How a config is resolved for a command: defaults < recipe < named flags < ``--set``, then every setting
that names a row of an extension-point table checked against that table.

The dataclasses and the rules each field checks by itself (types, bounds, fixed choices) live in
:mod:`moquad.config`, at the bottom of the package: every stage imports it. The tables a setting
chooses from (backbones, appearance and motion ops, flip policies, model inputs, dataset adapters,
preprocessing engines) live in the modules that own them, which import ``moquad.config``; this module
sits above both, so the choices are read from the tables themselves (:data:`CHOICES`) and a new table
row is a valid setting at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from moquad.config import (
    ConfigError,
    EvalConfig,
    FinetuneConfig,
    LinearConfig,
    LoaderConfig,
    PreprocessConfig,
    PretrainConfig,
    check_value,
    parse_sets,
    type_hints,
    update,
)
from moquad.data.ops import APPEARANCE_OPS, FLIP_POLICIES, MOTION_OPS
from moquad.models.backbones import BACKBONES, INPUTS  # the backbone and input tables (import no torch)
from moquad.preprocess.datasets import DATASETS
from moquad.preprocess.engines import ENGINES
from moquad.recipes import load_recipe
from moquad.train.methods import METHODS
from moquad.train.optimizers import OPTIMIZERS

T = TypeVar("T")

# (config class, field) -> the table whose names the field takes (each element, for a tuple of names)
CHOICES: dict[tuple[type, str], Mapping[str, Any]] = {
    (PreprocessConfig, "dataset"): DATASETS,
    (PreprocessConfig, "engine"): ENGINES,
    (LoaderConfig, "appearance_op"): APPEARANCE_OPS,
    (LoaderConfig, "motion_ops"): MOTION_OPS,
    (LoaderConfig, "flip"): FLIP_POLICIES,
    (PretrainConfig, "backbone"): BACKBONES,
    (PretrainConfig, "model_input"): INPUTS,
    (PretrainConfig, "method"): METHODS,
    (FinetuneConfig, "backbone"): BACKBONES,
    (PretrainConfig, "optimizer"): OPTIMIZERS,
    (LinearConfig, "optimizer"): OPTIMIZERS,
    (FinetuneConfig, "optimizer"): OPTIMIZERS,
}


# config class -> (what its recipes are, the commands that take them, their stage folder): a recipe of another
# stage given to a command is named as such (an evaluation recipe given to `moquad pretrain`)
RECIPE_KINDS: dict[type, tuple[str, str, str]] = {
    PreprocessConfig: ("a preprocessing recipe", "`moquad preprocess`", "preprocess"),
    PretrainConfig: ("a pre-training recipe", "`moquad pretrain`", "train"),
    EvalConfig: ("an evaluation recipe", "`moquad retrieve`, `linear`, `finetune`, `extract` or `cam`", "eval"),
}


def other_stage(cfg: Any, values: Mapping[str, Any], recipe: str | Path) -> str | None:
    """Why a recipe whose settings ``cfg`` refuses was given to the wrong command: its settings are all those of
    another stage's config (:data:`RECIPE_KINDS`); None when they are not (a typo, then)."""
    own = RECIPE_KINDS.get(type(cfg))
    for cls, (what, commands, _) in RECIPE_KINDS.items():
        if own and cls is not type(cfg) and values and set(values) <= {f.name for f in fields(cls)}:
            return (f"recipe {recipe} is {what} (for {commands}), not {own[0]}; use it there, or give "
                    f"this one {own[0]} (`moquad recipes --stage {own[2]}` lists them)")
    return None


def choices(cls: type, name: str) -> tuple[str, ...] | None:
    """The names field ``name`` of config class ``cls`` may take from its table; None for a field without one."""
    table = CHOICES.get((cls, name))
    return None if table is None else tuple(table)


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Every setting of ``cfg`` (nested ones too) that names a table row names one, else :class:`ConfigError`
    (``loader.appearance_op must be one of rad_inter, ..., got 'blur'``)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif (names := choices(type(cfg), f.name)) is not None:
            check_value(prefix + f.name, type_hints(type(cfg))[f.name], value, {"choices": names})


def resolve(cfg: T, recipe: str | Path | None, overrides: dict[str, Any], sets: list[str] | tuple[str, ...] = ()) -> T:
    """defaults < recipe < named flags < ``--set`` assignments; ``None`` in ``overrides`` means 'flag not given'.
    The result is checked whole, table choices included."""
    if recipe:
        values = load_recipe(recipe)
        try:
            cfg = update(cfg, values)
            check_choices(cfg)
        except ConfigError as e:
            why = other_stage(cfg, values, recipe) if e.problem == "is unknown" else None
            raise ConfigError(e.key, e.problem, why or f"{e} (in recipe {recipe})") from None
    given: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:  # "loader.frames" -> nested
            outer, inner = key.split(".", 1)
            given.setdefault(outer, {})[inner] = value
        else:
            given[key] = value
    cfg = update(cfg, given)
    cfg = update(cfg, parse_sets(cfg, sets)) if sets else cfg
    check_choices(cfg)
    return cfg
