"""Nothing on pytest's path shadows anything: a module of ``tests/``, ``benchmarks/`` or ``experiments/`` (the folders
of ``pythonpath`` in ``pyproject.toml``, which come before site-packages) never takes the name of an installed
distribution's top-level module, of the standard library, or of a module in another of those folders. A helper
named like a package (``kernels``, ``fixtures``, ``record``) hides that package from every library that imports it
the day it is installed, as a dependency's new release may do at any time."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections import defaultdict
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as tomli (in the lock there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYTEST_OWN = {"conftest"}  # pytest's own name for its per-folder plugins, never imported by name


def path_folders() -> list[Path]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return [ROOT / p for p in ini["pythonpath"]]


def modules(folder: Path) -> set[str]:
    """The top-level names a folder on the path defines: its ``*.py`` files and its packages (or namespace
    packages: any sub-folder holding Python files)."""
    names = {p.stem for p in folder.glob("*.py")}
    names |= {p.name for p in folder.iterdir() if p.is_dir() and p.name.isidentifier() and any(p.rglob("*.py"))}
    return names - PYTEST_OWN


def installed_names() -> dict[str, str]:
    """Every top-level module an installed distribution provides, and every distribution's own name as an import
    name: name -> distribution."""
    names: dict[str, str] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        names[top] = dists[0]
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            names.setdefault(re.sub(r"[-_.]+", "_", name).lower(), name)
    return names


def test_the_path_folders_are_those_of_pyproject():
    assert [p.name for p in path_folders()] == ["tests", "benchmarks", "experiments"]
    assert all(p.is_dir() for p in path_folders())


def test_no_module_on_the_path_takes_an_installed_or_standard_name():
    installed = installed_names()
    clashes = []
    for folder in path_folders():
        for name in sorted(modules(folder)):
            if name in sys.stdlib_module_names:
                clashes.append(f"{folder.name}/{name}: the standard library's {name}")
            owner = installed.get(name) or installed.get(name.lower())
            if owner and owner.lower() != "moquad":
                clashes.append(f"{folder.name}/{name}: the top-level module of the installed {owner}")
    assert clashes == [], "rename these helpers (a name no package on PyPI has): " + "; ".join(clashes)


def test_no_two_path_folders_define_the_same_name():
    where = defaultdict(list)
    for folder in path_folders():
        for name in modules(folder):
            where[name].append(folder.name)
    assert {n: f for n, f in where.items() if len(f) > 1} == {}, "shared code lives once, in the package"


def test_the_check_sees_a_shadowing_helper(tmp_path):
    """The check itself: a folder with a helper named like the standard library or an installed package is caught."""
    (tmp_path / "json.py").write_text("")
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "x.py").write_text("")
    (tmp_path / "conftest.py").write_text("")
    names = modules(tmp_path)
    assert names == {"json", "numpy"}
    assert "json" in sys.stdlib_module_names and installed_names()["numpy"] == "numpy"
