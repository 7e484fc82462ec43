"""YAML recipes: files of settings, each optionally on top of a ``base:`` recipe.

A recipe is read into a plain dict here; :func:`moquad.config.resolve` applies and checks it.
Recipes live at the top level of the checkout (``train/``, ``eval/``, ``preprocess/``), beside the
package: :func:`find_recipe` finds ``train/cpu_demo.yaml`` from any working folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from moquad.errors import MoquadError

# the checkout's top level: train/, eval/ and preprocess/ recipes live there, beside the package
REPO_ROOT = Path(__file__).resolve().parents[1]


class _RecipeLoader(yaml.SafeLoader):
    """YAML 1.2 floats: ``1e-6`` is a number (PyYAML's YAML 1.1 reads it as a string)."""


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def find_recipe(path: str | Path) -> Path:
    """``path`` as given, else relative to the checkout (``train/cpu_demo.yaml`` works from any folder)."""
    path = Path(path)
    if path.is_file() or path.is_absolute() or not (REPO_ROOT / path).is_file():
        return path
    return REPO_ROOT / path


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


def load_recipe(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML recipe into a plain dict.

    ``base: other.yaml`` (relative to the recipe) is loaded first and overridden, so each
    paper row is a few lines on top of a shared base. ``description`` and ``paper`` are
    documentation only (the paper's reported numbers for that row).
    """
    path = find_recipe(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} not found; pass a YAML file such as train/ucf101_r3d18_moquad.yaml")
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
