"""The public API (``moquad/__init__.py``): lazy, complete, documented; and docs/python.md's code, executed."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import moquad

ROOT = Path(__file__).resolve().parents[1]
PYTHON_PAGE = ROOT / "docs" / "python.md"


def test_import_moquad_loads_no_torch():
    """``import moquad`` (and listing its names) stays cheap: no torch, no stage module."""
    code = "import sys, moquad; dir(moquad); print(sorted(m for m in sys.modules if m == 'torch' or " \
           "m.startswith('moquad.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_every_public_name_resolves_and_has_a_docstring():
    """Each name of __all__ is its owner's object (not a module), and says what it is: its own docstring, or for a
    table (a dict) its owner module's docstring, which describes it."""
    assert len(moquad.__all__) == len(set(moquad.__all__))
    for name in moquad.__all__:
        obj = getattr(moquad, name)
        assert not inspect.ismodule(obj), name
        if name == "__version__":
            assert re.fullmatch(r"\d+\.\d+\.\d+\S*", obj)
            continue
        module, attr = moquad._API[name].split(":")
        assert obj is getattr(importlib.import_module(module), attr), name
        if isinstance(obj, dict):
            assert (sys.modules[module].__doc__ or "").strip(), f"{module} (owner of the table {attr}) has no docstring"
        else:
            assert (obj.__doc__ or "").strip(), f"{name} ({module}.{attr}) has no docstring"
            assert not isinstance(obj, type) or "__doc__" in vars(obj), name


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        moquad.nope  # noqa: B018


def test_version_is_the_packages_and_the_cli_prints_it():
    from typer.testing import CliRunner

    from moquad.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"moquad {moquad.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "moquad.__version__"' in pyproject


def test_losses_default_to_the_papers_settings():
    """tau 0.1, beta 0.01, alpha 1.5 (Sec. 4.1), the same numbers as PretrainConfig's defaults."""
    cfg = moquad.PretrainConfig()
    for fn in (moquad.moquad_loss, moquad.appearance_loss, moquad.nt_xent_loss):
        assert inspect.signature(fn).parameters["tau"].default == cfg.temperature
    params = inspect.signature(moquad.moquad_loss).parameters
    assert (params["hard_beta"].default, params["hard_alpha"].default) == (cfg.hard_beta, cfg.hard_alpha) == (0.01, 1.5)


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def _toy_dataset(root: Path) -> Path:
    """A train and a test split of coded videos (4 classes), written by the product's shard writer."""
    from fixtures import coded_video, write_dataset

    data = root / "shards"
    write_dataset(data, [(f"v{v:02d}", coded_video(v, 24, 32, 40), v % 4) for v in range(12)], videos_per_shard=4)
    write_dataset(data, [(f"t{v:02d}", coded_video(v, 24, 32, 40), v % 4) for v in range(12, 16)], split="test",
                  videos_per_shard=4)
    return data


def test_the_python_page_runs(tmp_path, monkeypatch, capsys):
    """docs/python.md's training loop (warm-up then quadruples) and its evaluation of the same network, executed
    at toy size on a small dataset: the page's code is the code that works."""
    blocks = python_blocks(PYTHON_PAGE)
    loop, evaluate = blocks[0], blocks[2]
    settings = {'DATA = "data/shards/ucf101"': f'DATA = {str(_toy_dataset(tmp_path))!r}',
                "EPOCHS, BATCH, FRAMES, SIZE, WORKERS = 20, 32, 16, 112, 4": "EPOCHS, BATCH, FRAMES, SIZE, WORKERS = 3, 4, 4, 16, 0"}
    for old, new in settings.items():
        assert old in loop, f"docs/python.md changed: update this test's settings ({old})"
        loop = loop.replace(old, new)
    evaluate = evaluate.replace("num_clips=10)", "num_clips=2, workers=0, device='cpu')")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "python_page"}
    exec(compile(loop, str(PYTHON_PAGE), "exec"), namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert re.findall(r"epoch (\d) \((\w+)\)", out) == [("0", "appearance"), ("1", "moquad"), ("2", "moquad")]
    assert (tmp_path / "my_encoder.pt").is_file()
    exec(compile(evaluate, str(PYTHON_PAGE), "exec"), namespace)  # noqa: S102
    knn = namespace["knn"]
    assert namespace["gallery"].shape == (12, 64) and namespace["queries"].shape == (4, 64)
    assert 0.0 <= knn["knn_top1"] <= 1.0 and "weighted kNN top-1" in capsys.readouterr().out
