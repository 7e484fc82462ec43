"""The documentation: the site builds in strict mode (broken links, anchors, nav and API references fail), its
generated pages hold every command and public name, and the README stays a front page whose numbers are all on
the docs pages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import moquad

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` of this checkout into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_strict_build_has_every_page(site):
    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node.removesuffix(".md")]
        items = node.values() if isinstance(node, dict) else node
        return [p for item in items for p in pages(item)]

    nav_pages = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(nav_pages) > 20
    for page in nav_pages:
        built = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert built.is_file(), page


def test_cli_reference_is_every_commands_help(site):
    """docs/cli.md is generated from the commands: each one's usage line and options are on the page."""
    import typer

    from moquad.cli import app

    html = (site / "cli" / "index.html").read_text()
    names = typer.main.get_command(app).list_commands(None)
    assert {"preprocess", "pretrain", "retrieve", "motion", "quickstart"} <= set(names)
    for name in names:
        assert f'id="moquad-{name}"' in html, name
    assert "--version" in html and "--print-config" in html


def test_api_reference_documents_every_public_name(site):
    """docs/api.md is generated from ``moquad._API``: every public name is rendered from its docstring."""
    html = (site / "api" / "index.html").read_text()
    for name, target in moquad._API.items():
        module, attr = target.split(":")
        assert f'id="{module}.{attr}"' in html, name
    assert ":func:" not in html  # Sphinx roles are shown as code
    assert "Eq. 1" in html and "make_loader" in html


def test_readme_is_a_front_page_whose_numbers_are_on_the_docs_pages():
    """At most ~300 lines; every number in its prose and tables (code left out) appears on a docs page."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "this round" not in readme.lower() and not re.search(r"\b[0-9a-f]{7}\b(?![\w.])", readme)
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    prose = re.sub(r"`[^`]*`|\]\([^)]*\)", "", prose)  # inline code, link targets
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    numbers = set(re.findall(r"(?<![\w.])[+−-]?\d[\d,]*(?:\.\d+)?", prose))
    missing = sorted(n for n in numbers if len(n.lstrip("+−-")) > 1 and n.lstrip("+−-") not in docs)
    assert not missing, f"README numbers on no docs page: {missing}"


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_citation_names_the_paper_as_its_tex_does():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == moquad.__version__
    paper = cff["preferred-citation"]
    assert paper["title"] == "MoQuad: Motion-focused Quadruple Construction for Video Contrastive Learning"
    assert [a["family-names"] for a in paper["authors"]] == ["Liu", "Chen", "Wu"]
    tex = ROOT.parent / "shared" / "paper" / "moquad.tex"
    if tex.is_file():
        assert f"\\title{{{paper['title']}}}" in tex.read_text()


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
