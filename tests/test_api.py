"""The public API (``moquad/__init__.py``): lazy, complete, documented; and docs/guides/python.md's code, executed."""

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
PYTHON_PAGE = ROOT / "docs" / "guides" / "python.md"


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
    from video_fixtures import coded_video, write_dataset

    data = root / "shards"
    write_dataset(data, [(f"v{v:02d}", coded_video(v, 24, 32, 40), v % 4) for v in range(12)], videos_per_shard=4)
    write_dataset(data, [(f"t{v:02d}", coded_video(v, 24, 32, 40), v % 4) for v in range(12, 16)], split="test",
                  videos_per_shard=4)
    return data


def test_the_python_page_runs(tmp_path, monkeypatch, capsys):
    """docs/guides/python.md's training loop (warm-up then quadruples) and its evaluation of the same network, executed
    at toy size on a small dataset: the page's code is the code that works."""
    blocks = python_blocks(PYTHON_PAGE)
    loop, evaluate = blocks[0], blocks[2]
    settings = {'DATA = "data/shards/ucf101"': f'DATA = {str(_toy_dataset(tmp_path))!r}',
                "EPOCHS, BATCH, FRAMES, SIZE, WORKERS = 20, 32, 16, 112, 4": "EPOCHS, BATCH, FRAMES, SIZE, WORKERS = 3, 4, 4, 16, 0"}
    for old, new in settings.items():
        assert old in loop, f"docs/guides/python.md changed: update this test's settings ({old})"
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


def test_dir_holds_only_the_public_names():
    """Tab completion and ``dir(moquad)`` show what a user may call, not the module's imports or its table."""
    assert dir(moquad) == sorted(moquad.__all__)
    assert not {"Any", "annotations", "importlib", "_API"} & set(dir(moquad))


def _docstrings() -> dict[str, str]:
    """Every public name's docstring (a table: none, its rows say what they are) and those of the public methods
    and properties its class defines."""
    out = {}
    for name, target in moquad._API.items():
        module, attr = target.split(":")
        obj = getattr(importlib.import_module(module), attr)
        if isinstance(obj, dict):
            continue
        out[name] = obj.__doc__ or ""
        if isinstance(obj, type):
            for key, value in vars(obj).items():
                fn = value.fget if isinstance(value, property) else getattr(value, "func", value)
                if not key.startswith("_") and callable(fn) and fn.__doc__:
                    out[f"{name}.{key}"] = fn.__doc__
    return out


def internal_names(text: str) -> list[str]:
    """What a reader of a public docstring cannot look up: Sphinx roles, "(module docstring)", a ``moquad.`` path
    that is not a public name (``moquad.data.views.ViewPlan``), a private name (``_fix_up``), an UPPER_CASE
    constant in code style that is not public (``INPUTS``)."""
    found = re.findall(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj):", text)
    found += re.findall(r"module docstring", text, flags=re.I)
    for path in re.findall(r"\bmoquad((?:\.\w+)+)", text):
        first, *rest = path.split(".")[1:]
        if first not in moquad._API or (rest and not first[0].isupper()):
            found.append("moquad" + path)
    found += re.findall(r"(?<![\w.'/-])_[a-z]\w*", text)
    found += [c for c in re.findall(r"``([A-Z][A-Z0-9_]{2,})``", text) if c not in moquad._API]
    return found


def test_internal_names_are_found():
    text = ("See :func:`x` (module docstring); moquad.data.views.ViewPlan and moquad.ViewPlan, moquad.Split.payload; "
            "``_fix_up``, ``INPUTS``, ``METHODS`` and ``BACKBONES``.")
    assert internal_names(text) == [":func:", "module docstring", "moquad.data.views.ViewPlan", "_fix_up", "INPUTS"]


def test_public_docstrings_name_only_what_a_reader_can_see():
    """``help(moquad.X)`` reads in a terminal: no Sphinx markup, no internal module paths or private names, no
    pointer to a module docstring the reader does not see."""
    bad = {name: found for name, doc in _docstrings().items() if (found := internal_names(doc))}
    assert not bad, bad


def test_help_renders_each_public_name_in_plain_text():
    """pydoc's terminal rendering of every public function and class starts with its public name's object and
    shows its own docstring whole (what ``help()`` prints)."""
    import pydoc

    for name, doc in _docstrings().items():
        if "." in name:
            continue
        text = pydoc.render_doc(getattr(moquad, name), renderer=pydoc.plaintext)
        assert inspect.cleandoc(doc).splitlines()[0] in text, name


def test_every_setting_of_the_public_configs_has_help():
    """The API page's setting tables and the CLI's flags read each field's help: a setting without one would be
    an empty row (nested configs are rows of their own)."""
    import dataclasses

    from moquad.config import EvalConfig, PretrainConfig

    def missing(cls: type, prefix: str = "") -> list[str]:
        out, defaults = [], cls()
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(getattr(defaults, f.name)):
                out += missing(type(getattr(defaults, f.name)), f"{prefix}{f.name}.")
            elif not f.metadata.get("help"):
                out.append(prefix + f.name)
        return out

    for cls in (moquad.LoaderConfig, PretrainConfig, EvalConfig, moquad.PreprocessConfig):
        assert not missing(cls), (cls.__name__, missing(cls))


def test_the_python_page_covers_every_public_name():
    """docs/guides/python.md's task table names every public name (``moquad.NAME``): the page a user writes code from."""
    page = PYTHON_PAGE.read_text()
    missing = [name for name in moquad.__all__ if f"moquad.{name}" not in page]
    assert not missing, missing


def test_the_python_pages_data_section_runs(tmp_path, monkeypatch, capsys):
    """"Data from Python": make_synth, then preprocess_dataset, then a Split of the shards, at toy size."""
    block = python_blocks(PYTHON_PAGE)[4]
    for old, new in {"classes=4, per_class=8, size=64, frames=48": "classes=2, per_class=3, size=32, frames=16",
                     "short_side=128, workers=4": "short_side=32, workers=1"}.items():
        assert old in block, f"docs/guides/python.md changed: update this test's settings ({old})"
        block = block.replace(old, new)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(PYTHON_PAGE), "exec"), {"__name__": "python_page"})  # noqa: S102
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == "{'test': 4, 'train': 2}"  # synth's UCF101 layout: whole groups go to the test split
    assert lines[-1] == "2 ['Translate' 'Rotate'] (2, 32, 32, 3)"
