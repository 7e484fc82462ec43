"""YAML recipes: files of settings, each optionally on top of a ``base:`` recipe.

A recipe is read into a plain dict here; :func:`moquad.config.resolve` applies and checks it.
The recipes ship inside the package (package data), one folder per stage: ``moquad/recipes/
{preprocess,train,eval}/*.yaml``, so a plain ``pip install`` has them. A recipe is named by
:func:`find_recipe` in any of three ways: a path to a file (``my.yaml``, read as given), a path
inside the recipe folders (``train/cpu_demo.yaml``, the names recipes had at the checkout's top
level), or a bare name (``ucf101_r3d18_moquad``, looked up in the command's stage).
``moquad recipes`` lists them (:func:`list_recipes`); files starting with ``_`` are bases.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from moquad.errors import MoquadError

RECIPE_ROOT = Path(__file__).resolve().parent  # holds preprocess/, train/ and eval/

STAGES = ("preprocess", "train", "eval")  # the stage folders, in pipeline order


class _RecipeLoader(yaml.SafeLoader):
    """YAML 1.2 floats: ``1e-6`` is a number (PyYAML's YAML 1.1 reads it as a string)."""


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _named(name: str, stage: str | None) -> list[Path]:
    """The packaged recipes a name (``ucf101_r3d18_moquad``, ``ablations/warmup_0``, ``eval/cpu_demo``) may mean."""
    stem = name[:-5] if name.endswith(".yaml") else name
    first, _, rest = stem.partition("/")
    if first in STAGES and rest:  # the stage spelled out: it wins over the command's
        stage, stem = first, rest
    stages = (stage,) if stage else STAGES
    return [p for st in stages if (p := RECIPE_ROOT / st / f"{stem}.yaml").is_file()]


def find_recipe(path: str | Path, stage: str | None = None) -> Path:
    """The file a recipe name means: ``path`` itself when it is a file; else a path inside the packaged
    recipes (``train/cpu_demo.yaml``); else a bare name in ``stage`` (any stage when None: it must then be
    unique). A name found nowhere comes back unchanged (:func:`load_recipe` then says it is missing)."""
    path = Path(path)
    if path.is_file() or path.is_absolute():
        return path
    if (RECIPE_ROOT / path).is_file() and path.parts[0] in STAGES:
        return RECIPE_ROOT / path
    found = _named(path.as_posix(), stage)
    if len(found) > 1:
        names = ", ".join(p.relative_to(RECIPE_ROOT).as_posix() for p in found)
        raise MoquadError(f"recipe {path} is ambiguous ({names}); name one of those")
    return found[0] if found else path


def list_recipes() -> list[dict[str, str]]:
    """Every packaged recipe (bases excluded): its ``name``, ``stage`` and ``description``, stage by stage."""
    out = []
    for stage in STAGES:
        for path in sorted((RECIPE_ROOT / stage).rglob("*.yaml")):
            if path.name.startswith("_"):
                continue
            text = read_recipe_file(path).get("description", "")
            out.append({"name": path.relative_to(RECIPE_ROOT / stage).with_suffix("").as_posix(), "stage": stage,
                        "description": " ".join(str(text).split())})
    return out


def read_recipe_file(path: Path) -> dict[str, Any]:
    """One YAML file as a dict (no ``base`` handling); syntax errors -> ``recipe FILE line L: problem``."""
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" line {mark.line + 1}" if mark else ""
        raise MoquadError(f"recipe {path}{line}: {e.problem or e.context}; fix the YAML syntax") from None
    except yaml.YAMLError as e:
        raise MoquadError(f"recipe {path}: {str(e).splitlines()[0]}; fix the YAML syntax") from None
    except UnicodeDecodeError:
        raise MoquadError(f"recipe {path} is not a text file; pass a YAML recipe") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MoquadError(f"recipe {path} must be a YAML mapping of settings (key: value lines)")
    return data


def load_recipe(path: str | Path, _chain: tuple[Path, ...] = (), stage: str | None = None) -> dict[str, Any]:
    """Read a YAML recipe (a name :func:`find_recipe` resolves, in ``stage`` when given) into a plain dict.

    ``base: other.yaml`` (relative to the recipe) is loaded first and overridden, so each
    paper row is a few lines on top of a shared base. ``description`` and ``paper`` are
    documentation only (the paper's reported numbers for that row).
    """
    path = find_recipe(path, stage)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} not found; pass a YAML file or a recipe name that `moquad recipes` "
                                "lists, such as ucf101_r3d18_moquad")
    if path.resolve() in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path.resolve()))
        raise MoquadError(f"recipe {path}: its base chain is a cycle ({cycle}); remove one of the base: lines")
    data = read_recipe_file(path)
    data.pop("description", None)
    data.pop("paper", None)
    base = data.pop("base", None)
    if base:
        data = _deep_merge(load_recipe(path.parent / str(base), (*_chain, path.resolve())), data)
    return data


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
