"""How a config is resolved for a command: defaults < recipe < named flags < ``--set``, then every setting
that names a row of an extension-point table checked against that table, and the settings a row fills when left
unset filled (:data:`SETTLE`: pre-training's optimizer and its setting, from the backbone's row).

The dataclasses and the rules each field checks by itself (types, bounds, fixed choices) live in
:mod:`moquad.config`, at the bottom of the package: every stage imports it. The tables a setting
chooses from (backbones, appearance and motion ops, flip policies, model inputs, dataset adapters,
preprocessing engines) live in the modules that own them, which import ``moquad.config``; this module
sits above both, so the choices are read from the tables themselves (:data:`CHOICES`) and a new table
row is a valid setting at once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from moquad.config import (
    AttentiveConfig,
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
from moquad.train.optimizers import OPTIMIZERS, pretrain_optimizer

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
    (AttentiveConfig, "optimizer"): OPTIMIZERS,
}


# config class -> the settings a table row fills when they are left unset (the backbone's optimizer and its setting)
SETTLE: dict[type, Callable[[Any], Any]] = {PretrainConfig: lambda cfg: pretrain_optimizer(cfg)[0]}


# config class -> (what its recipes are, the commands that take them, their stage folder): a recipe of another
# stage given to a command is named as such (an evaluation recipe given to `moquad pretrain`)
RECIPE_KINDS: dict[type, tuple[str, str, str]] = {
    PreprocessConfig: ("a preprocessing recipe", "`moquad preprocess`", "preprocess"),
    PretrainConfig: ("a pre-training recipe", "`moquad pretrain`", "train"),
    EvalConfig: ("an evaluation recipe", "`moquad retrieve`, `linear`, `attentive`, `finetune`, `extract` or `cam`",
                 "eval"),
}


def recipe_stage(cls: type) -> str | None:
    """The stage folder where a bare recipe name is looked up for config class ``cls``, as its command looks it
    up: ``cpu_demo`` is ``train/cpu_demo.yaml`` for a :class:`PretrainConfig` (``moquad pretrain``) and
    ``eval/cpu_demo.yaml`` for an :class:`EvalConfig` (the evaluation commands); None (any stage, where the name
    must be unique) for a config whose command takes no recipe."""
    kind = RECIPE_KINDS.get(cls)
    return kind[2] if kind else None


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


def setting_names(cfg: Any, prefix: str = "") -> list[str]:
    """Every setting of ``cfg``, nested ones dotted (``loader.dilations``)."""
    return [name for f in fields(cfg) for name in (
        setting_names(getattr(cfg, f.name), f"{prefix}{f.name}.") if is_dataclass(getattr(cfg, f.name))
        else [prefix + f.name])]


def did_you_mean(cfg: Any, key: str) -> str | None:
    """The setting of ``cfg`` that an unknown ``key`` most likely meant: the closest at the same level (``epoch``
    -> ``epochs``, ``loader.dilation`` -> ``loader.dilations``), else the closest at any level (``dilation`` ->
    ``loader.dilations``); None when nothing is close."""
    names = [n for n in setting_names(cfg) if not key.startswith(n + ".")]  # epochs.x: epochs has no sub-settings
    parent, _, leaf = key.rpartition(".")
    siblings = {n.rpartition(".")[2]: n for n in names if n.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.7)  # the same level: loader.dilation
    if near:
        return siblings[near[0]]
    last = {n.rpartition(".")[2]: n for n in reversed(names)}  # any level (a top-level name wins a tie): dilation
    near = difflib.get_close_matches(leaf, list(last), n=1, cutoff=0.8)
    return last[near[0]] if near else None


def with_suggestion(cfg: Any, e: ConfigError) -> ConfigError:
    """``e`` with "did you mean X?" when it is an unknown setting close to one of ``cfg``."""
    guess = did_you_mean(cfg, e.key) if e.problem == "is unknown" else None
    if guess is None:
        return e
    return ConfigError(e.key, e.problem, str(e).replace(f"{e.key!r}", f"{e.key!r} (did you mean {guess}?)", 1))


def resolve(cfg: T, recipe: str | Path | None, overrides: dict[str, Any], sets: list[str] | tuple[str, ...] = ()) -> T:
    """defaults < recipe < named flags < ``--set`` assignments; ``None`` in ``overrides`` means 'flag not given'.
    A recipe is a YAML file or a name, looked up where the command of ``cfg``'s stage looks it up:
    ``moquad.resolve_config(moquad.PretrainConfig(), "cpu_demo", {"data": "data/shards"})`` is
    ``moquad pretrain --recipe cpu_demo --data data/shards``. The result is checked whole, table choices included. An unknown setting close to a real one says which
    (``unknown setting 'loader.dilation'; did you mean loader.dilations? valid: ...``)."""
    try:
        return _resolve(cfg, recipe, overrides, sets)
    except ConfigError as e:
        raise with_suggestion(cfg, e) from None


def _resolve(cfg: T, recipe: str | Path | None, overrides: dict[str, Any], sets: list[str] | tuple[str, ...]) -> T:
    if recipe:
        values = load_recipe(recipe, stage=recipe_stage(type(cfg)))
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
    return SETTLE[type(cfg)](cfg) if type(cfg) in SETTLE else cfg
