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
        try:
            cfg = update(cfg, load_recipe(recipe))
            check_choices(cfg)
        except ConfigError as e:
            raise ConfigError(e.key, e.problem, f"{e} (in recipe {recipe})") from None
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
