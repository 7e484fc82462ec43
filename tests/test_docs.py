"""The documentation: the site builds in strict mode (broken links, anchors, nav and API references fail), its
generated pages hold every command and public name, and the README stays a front page whose numbers are all on
the docs pages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

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
        assert (site / f"{page}.html").is_file(), page


class _Links(HTMLParser):
    """The link targets (href, src) and the element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("href", "src") and value is not None:
                self.targets.append(value)
            elif key in ("id", "name") and value:
                self.ids.add(value)


def _parsed(page: Path, cache: dict[Path, _Links]) -> _Links:
    if page not in cache:
        cache[page] = _Links()
        cache[page].feed(page.read_text(errors="replace"))
    return cache[page]


def broken_links(site: Path) -> list[str]:
    """Every internal link of every page of ``site`` (but the server's 404 page) that does not open a file (a folder is a directory listing
    under ``file://``), or names an anchor its page lacks: ``"page.html -> target (why)"``."""
    cache: dict[Path, _Links] = {}
    broken = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":  # a server's page for any missing path: its links are from the site root
            continue
        for target in _parsed(page, cache).targets:
            url = urlsplit(target)
            if url.scheme or url.netloc or target.startswith(("#", "mailto:", "data:")) or not target:
                continue  # another site, or an anchor of this page (checked by the strict build)
            path = (page.parent / unquote(url.path)).resolve()
            why = ("outside the site" if site.resolve() not in (path, *path.parents) else "a folder" if path.is_dir()
                   else "missing" if not path.is_file() else None)
            if why is None and url.fragment and path.suffix == ".html" and unquote(url.fragment) not in _parsed(path, cache).ids:
                why = "no such anchor"
            if why:
                broken.append(f"{page.relative_to(site)} -> {target} ({why})")
    return broken


def test_every_internal_link_opens_a_page_not_a_folder(site):
    """The site works opened from disk (``site/index.html`` under ``file://``) as well as served: every link of every
    page, the navigation's included, names a file that exists (never a folder, which ``file://`` shows as a
    listing), and every anchor it names is on that page."""
    assert not broken_links(site), "\n".join(broken_links(site)[:40])
    index = (site / "index.html").read_text()
    assert 'href="getting_started.html"' in index


def test_search_and_pages_need_no_network(site):
    """Opened from disk, a page cannot fetch its search index (the browser refuses) nor, offline, anything from
    the web: the index is a script beside the pages, the search worker runs from ``js/iframe-worker.js``, and no
    page loads a script, style or font from another site."""
    assert (site / "search" / "search_index.js").read_text().startswith("var __index = {")
    index = (site / "index.html").read_text()
    assert '<script src="js/iframe-worker.js">' in index
    for page in site.rglob("*.html"):
        remote = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(https?:[^"]*)"', page.read_text())
        assert not remote, (page.name, remote)


def test_broken_links_finds_folders_missing_files_and_anchors(tmp_path):
    """The checker itself: a link to a folder, to a missing file and to a missing anchor are each reported."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b.html").write_text('<h1 id="top">b</h1>')
    (tmp_path / "index.html").write_text('<a href="a/">x</a><a href="b.html#top">ok</a><a href="b.html#nope">y</a>'
                                         '<a href="c.html">z</a><a href="https://x.org/">w</a><img src="b.html">')
    assert broken_links(tmp_path) == ["index.html -> a/ (a folder)", "index.html -> b.html#nope (no such anchor)",
                                      "index.html -> c.html (missing)"]


def test_cli_reference_is_every_commands_help(site):
    """docs/cli.md is generated from the commands: each one's usage line and options are on the page."""
    import typer

    from moquad.cli import app

    html = (site / "cli.html").read_text()
    names = typer.main.get_command(app).list_commands(None)
    assert {"preprocess", "pretrain", "retrieve", "motion", "quickstart"} <= set(names)
    for name in names:
        assert f'id="moquad-{name}"' in html, name
    assert "--version" in html and "--print-config" in html


def test_api_reference_documents_every_public_name(site):
    """docs/api.md is generated from ``moquad._API``: every public name is rendered from its docstring."""
    html = (site / "api.html").read_text()
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
