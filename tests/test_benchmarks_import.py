"""Every benchmark and experiment script still imports against the package (a renamed function broke `make bench`
twice), and no script or test edits ``sys.path``: shared code lives in the package or in one module of the
script's own folder (on the path when the script runs; pytest's ``pythonpath`` for the tests)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("bench_*.py"),
                  *(ROOT / "experiments").glob("*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=[f"{p.parent.name}/{p.stem}" for p in SCRIPTS])
def test_script_imports(path, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # top level only: each runs its work under `if __name__ == "__main__"`
    assert callable(module.main)


def test_no_script_edits_sys_path():
    edits = re.compile(r"sys\.path\s*(\.insert|\.append|\[|=|\+=)")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("benchmarks", "experiments")
             for p in sorted((ROOT / folder).glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if edits.search(line)]
    assert found == []
