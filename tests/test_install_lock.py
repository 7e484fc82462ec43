"""The lock (``requirements-lock.txt``): it pins every package the product and each extra install, with hashes, and
the environment the tests run in is exactly the lock (``make setup``), so a release upstream never changes what the
tests see. ``make test-latest`` runs the suite on the newest releases instead (``MOQUAD_UNLOCKED=1``), where the
comparison with the lock is skipped."""

from __future__ import annotations

import os
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as tomli (in the lock there)
    import tomli as tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from moquad import record

ROOT = Path(__file__).resolve().parents[1]
LOCK = (ROOT / "requirements-lock.txt").read_text()


def test_the_lock_pins_every_dependency_of_every_extra_with_hashes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    wanted |= {canonicalize_name(Requirement(r).name) for extra in project["optional-dependencies"].values()
               for r in extra}
    pinned = {canonicalize_name(m.group(1)) for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", LOCK, re.M)}
    assert wanted - pinned == set()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.strip())
    assert len(blocks) == len(re.findall(r"^[A-Za-z0-9]", LOCK, re.M)) >= 150
    assert all("--hash=sha256:" in b for b in blocks), [b.split()[0] for b in blocks if "--hash" not in b]
    for name, version in (("torch", "2.14.1"), ("torchvision", "0.29.1")):  # the pins of constraints.txt hold
        assert f"\n{name}=={version} " in LOCK


def test_the_lock_reads_each_pin_under_its_markers():
    text = ("numpy==2.2.6 ; python_full_version < '3.0' \\\n    --hash=sha256:ab\n"
            "numpy==2.4.6 ; python_full_version >= '3.0' \\\n    --hash=sha256:cd\n    # via moquad\n"
            "Foo_Bar==1.0 \\\n    --hash=sha256:ef\n"
            "winonly==1.0 ; sys_platform == 'no-such-platform' \\\n    --hash=sha256:00\n")
    assert record._locked(text) == {"numpy": "2.4.6", "foo-bar": "1.0"}


@pytest.mark.skipif(bool(os.environ.get("MOQUAD_UNLOCKED")), reason="make test-latest: the newest releases, no lock")
def test_the_environment_is_exactly_the_lock():
    """What ``make setup`` installed is the lock, no more, no less (``pip freeze`` equals the lock's pins for this
    Python; a local version label such as ``+cu130`` counts as its public version)."""
    got = record.lock()
    assert got["sha256"] and (got["differs"], got["extra"], got["missing"]) == ([], [], []), \
        "run `make setup` (or `make lock` after changing pyproject.toml)"
    assert got["matches"] is True


def test_a_result_names_the_lock_beside_the_commit_and_machine():
    env = record.environment()
    assert set(env) >= {"commit", "dirty", "lock", "machine"}
    assert len(env["lock"]["sha256"]) == 16 and env["machine"]["cores"] >= 1


@pytest.mark.skipif(bool(os.environ.get("MOQUAD_UNLOCKED")), reason="make test-latest: the newest releases, no lock")
def test_a_vendored_copy_on_sys_path_is_not_installed(tmp_path, monkeypatch):
    """A package that puts its own vendored distributions on sys.path (Ray's thirdparty_files: psutil) does not make
    the environment differ from the lock: what counts is what is installed in site-packages, as pip freeze sees."""
    info = tmp_path / "vendored_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendored-pkg\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = record._installed()
    assert "vendored-pkg" not in installed and installed["torch"].startswith("2.14.1")
