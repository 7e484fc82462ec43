"""How every config of moquad is checked and built: the rules of a field, coercion, ``--set`` parsing and
the precedence of defaults, recipes and flags (the dataclasses themselves live in :mod:`moquad.config`).

Checking: every field is checked when a config is built (``__post_init__``, so also by
``dataclasses.replace``), by its annotation plus the rules in its ``metadata``: ``choices``,
``ge`` / ``gt`` / ``le`` (bounds, per element for tuples) and ``ordered`` (a tuple must not
decrease). Allowed coercions: int -> float, list -> tuple, and a dict -> the nested config.
Nothing else: ``lr: "0.1"`` (a quoted YAML string) or ``epochs: 3.0`` are errors. Text from the
command line (``--set lr=0.1``) is parsed by the annotation first (:func:`parse_text`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
import typing
from dataclasses import asdict, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from moquad.errors import MoquadError
from moquad.recipes import load_recipe

T = TypeVar("T")


class ConfigError(MoquadError, ValueError):
    """A setting with a wrong type or value; ``key`` is its dotted name (``loader.size``)."""

    def __init__(self, key: str, problem: str, message: str | None = None):
        super().__init__(message or f"{key} {problem}")
        self.key, self.problem = key, problem


def rule(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **rules: Any) -> Any:
    """A dataclass field with checking rules: ``rule(200, ge=1)``, ``rule("moquad", choices=(...))``."""
    return field(default=default, default_factory=factory, metadata=rules)


# ----------------------------------------------------------------------------- checking


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """Field name -> annotation of a config class, resolved (the module uses postponed annotations)."""
    return typing.get_type_hints(cls)


_TYPE_NAMES = {int: ("an int", "ints"), float: ("a number", "numbers"), str: ("a string", "strings"),
               bool: ("true or false", "booleans")}


def _type_name(tp: Any, plural: bool = False) -> str:
    return _TYPE_NAMES.get(tp, (str(tp), str(tp)))[plural]


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _scalar(key: str, tp: Any, value: Any, rules: dict[str, Any]) -> Any:
    if tp is float and type(value) is int:
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(key, f"must be {_type_name(tp)}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
    for name, ok, word in (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<=")):
        if name in rules and not ok(value, rules[name]):
            raise ConfigError(key, f"must be {word} {rules[name]}, got {value!r}")
    return value


def check_value(key: str, tp: Any, value: Any, rules: dict[str, Any] | None = None) -> Any:
    """``value`` as annotation ``tp`` wants it (int -> float, list -> tuple), else :class:`ConfigError`."""
    rules = rules or {}
    tp, optional = unwrap_optional(tp)
    if value is None and optional:
        return None
    if typing.get_origin(tp) is not tuple:
        return _scalar(key, tp, value, rules)
    args = typing.get_args(tp)
    variadic = len(args) == 2 and args[1] is Ellipsis
    what = f"a list of {'' if variadic else f'{len(args)} '}{_type_name(args[0], plural=True)}"
    if not isinstance(value, (list, tuple)) or (variadic and not value) or (not variadic and len(value) != len(args)):
        raise ConfigError(key, f"must be {what}, got {value!r}")
    elems = args[:1] * len(value) if variadic else args
    out = tuple(_scalar(key, t, v, rules) for t, v in zip(elems, value))
    if rules.get("ordered") and list(out) != sorted(out):
        raise ConfigError(key, f"must not decrease (low, high), got {list(out)}")
    return out


def check(cfg: Any) -> None:
    """Check (and coerce in place) every field of a config; nested configs were checked when built."""
    hints = type_hints(type(cfg))
    for f in fields(cfg):
        tp, value = hints[f.name], getattr(cfg, f.name)
        if is_dataclass(tp):
            if isinstance(value, dict):
                value = update(tp(), value, prefix=f"{f.name}.")
            elif not isinstance(value, tp):
                raise ConfigError(f.name, f"must be a mapping of {tp.__name__} settings, got {value!r}")
            setattr(cfg, f.name, value)
        else:
            setattr(cfg, f.name, check_value(f.name, tp, value, dict(f.metadata)))


def parse_text(key: str, tp: Any, text: str) -> Any:
    """A command-line string as annotation ``tp`` reads it: ``1,4`` (or ``[1, 4]``) for tuples,
    ``true``/``false`` for bools, ``none`` for optional settings."""
    tp, optional = unwrap_optional(tp)
    text = text.strip()
    if optional and text.lower() in ("none", "null", ""):
        return None
    if typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        return tuple(parse_text(key, elem, part) for part in text.strip("[]()").split(",") if part.strip())
    if tp is bool:
        words = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
        if text.lower() not in words:
            raise ConfigError(key, f"must be true or false, got {text!r}")
        return words[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ConfigError(key, f"must be {_type_name(tp)}, got {text!r}") from None
    return text


# ----------------------------------------------------------------------------- building


def _valid_keys(cfg: Any, prefix: str = "") -> list[str]:
    return sorted(f"{prefix}{f.name}" + (".*" if is_dataclass(getattr(cfg, f.name)) else "") for f in fields(cfg))


def _unknown(key: str, valid: list[str]) -> ConfigError:
    return ConfigError(key, "is unknown", f"unknown setting {key!r}; valid: {', '.join(valid)}")


def update(cfg: T, values: dict[str, Any], prefix: str = "") -> T:
    """Return a checked copy of ``cfg`` with ``values`` applied; nested configs accept dicts.

    Unknown keys are an error (a typo in a recipe must not be silently ignored).
    """
    names = {f.name for f in fields(cfg)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            raise _unknown(f"{prefix}{key}", _valid_keys(cfg, prefix))
        current = getattr(cfg, key)
        if is_dataclass(current) and isinstance(value, dict):
            changes[key] = update(current, value, prefix=f"{prefix}{key}.")
        else:
            changes[key] = value
    try:
        return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]
    except ConfigError as e:
        if prefix and not e.key.startswith(prefix):
            raise ConfigError(prefix + e.key, e.problem) from None
        raise


def parse_sets(cfg: Any, assignments: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["epochs=5", "loader.dilations=1,4"]`` -> nested dict of values parsed by each field's annotation."""
    out: dict[str, Any] = {}
    for item in assignments:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item!r}", "must look like KEY=VALUE, e.g. --set loader.dilations=1,4")
        target, node, parts = cfg, out, key.strip().split(".")
        for i, part in enumerate(parts):
            prefix = ".".join(parts[:i]) + "." if i else ""
            if not is_dataclass(target):
                raise ConfigError(key, "is unknown", f"unknown setting {key!r}: {prefix[:-1]} has no sub-settings")
            if part not in {f.name for f in fields(target)}:
                raise _unknown(key, _valid_keys(target, prefix))
            if i < len(parts) - 1:
                target, node = getattr(target, part), node.setdefault(part, {})
            else:
                node[part] = parse_text(key, type_hints(type(target))[part], text)
    return out


def resolve(cfg: T, recipe: str | Path | None, overrides: dict[str, Any], sets: list[str] | tuple[str, ...] = ()) -> T:
    """defaults < recipe < named flags < ``--set`` assignments; ``None`` in ``overrides`` means 'flag not given'."""
    if recipe:
        try:
            cfg = update(cfg, load_recipe(recipe))
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
    return update(cfg, parse_sets(cfg, sets)) if sets else cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML/JSON-safe dict of a config (tuples become lists)."""

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean(asdict(cfg))


def dump(cfg: Any) -> str:
    """The config as YAML text (what ``--print-config`` shows and ``config.yaml`` holds)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from moquad.io import atomic_write_text

    atomic_write_text(path, dump(cfg))
