"""The documentation: the site builds in strict mode (broken links, anchors, nav and API references fail), its
generated pages hold every command and public name, and the README stays a front page whose numbers are all on
the docs pages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html import unescape
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
    assert 'href="getting_started.html"' in index and 'href="reference/api.html"' in index


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
    """docs/reference/cli.md is generated from the commands: each one's usage line and options are on the page."""
    import typer

    from moquad.cli import app

    html = (site / "reference" / "cli.html").read_text()
    names = typer.main.get_command(app).list_commands(None)
    assert {"preprocess", "pretrain", "retrieve", "motion", "quickstart"} <= set(names)
    for name in names:
        assert f'id="moquad-{name}"' in html, name
    assert "--version" in html and "--print-config" in html


def test_api_reference_documents_every_public_name(site):
    """docs/reference/api.md is generated from ``moquad._API``: every public name has its section, under its public name."""
    html = (site / "reference" / "api.html").read_text()
    for name in moquad._API:
        assert f'id="moquad.{name}"' in html, name
    assert ":func:" not in html  # Sphinx roles are shown as code
    assert "Eq. 1" in html and "make_loader" in html


def _api_sections(site: Path) -> dict[str, str]:
    """The API page cut at each public name's heading: name -> its HTML up to the next heading."""
    html = (site / "reference" / "api.html").read_text()
    marks = [(m.start(), m.group(1)) for m in re.finditer(r'<h[23] id="(?:moquad\.)?([\w.-]+)"', html)]
    return {name: html[start:end] for (start, name), (end, _) in zip(marks, [*marks[1:], (len(html), "")])}


def _text(html: str) -> str:
    """The text of some HTML on one line; a table row reads ``| cell | cell |``."""
    html = re.sub(r"<tr[^>]*>", " | ", re.sub(r"</t[dh]>", " | ", html))
    html = re.sub(r"<br>|</(?:p|h\d|div|dt|dd|li|pre)>", " ", html)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", html))).replace("| |", "|")


def _rows(html: str) -> dict[str, list[str]]:
    """The body rows of the HTML tables in ``html``: first cell's text -> the other cells' texts."""
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S):
        cells = [_text(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


def _check_settings(rows: dict[str, list[str]], cls: type, prefix: str = "") -> None:
    """Each setting of config class ``cls`` is a row of ``rows``: ``type = default`` as the dataclass holds them,
    then the field's help; a nested config that is not a public name is expanded (``linear.epochs``)."""
    import dataclasses

    from moquad.config import type_hints

    defaults = cls()
    for f in dataclasses.fields(cls):
        value, key = getattr(defaults, f.name), prefix + f.name
        if dataclasses.is_dataclass(value) and type(value).__name__ not in moquad._API:
            _check_settings(rows, type(value), f"{key}.")
            continue
        assert key in rows, (cls.__name__, key)
        if dataclasses.is_dataclass(value):
            continue
        (kind, default), help_text = rows[key][0].rsplit(" = ", 1), rows[key][1]
        hint = type_hints(cls)[f.name]
        assert kind == (hint.__name__ if isinstance(hint, type) else str(hint)), (key, kind)
        if f.default is not dataclasses.MISSING:
            assert default == repr(f.default), (key, default)
        assert " ".join(f.metadata["help"].replace("`", "").split()) in help_text, key


def test_api_page_lists_every_setting_of_the_config_classes(site):
    """Each public config class is a table of ALL its settings (nested ones dotted): name, type, default and the
    help written on the field, as the dataclass holds them; a table's choices are its rows."""
    sections = _api_sections(site)
    for name in ("LoaderConfig", "PretrainConfig", "EvalConfig", "PreprocessConfig"):
        _check_settings(_rows(sections[name]), getattr(moquad, name))
    assert "a row of moquad.METHODS: moquad, simclr" in _text(sections["PretrainConfig"])


def test_api_page_shows_public_names_and_tables_from_their_rows(site):
    """Signatures under their public names (``moquad.quadruple_views(cfg: LoaderConfig)``, not ``quadruple(``), each
    table with one row per entry, and no name a reader cannot look up (private names, internal module paths)."""
    import importlib

    from test_api import internal_names

    sections = _api_sections(site)
    for name, target in moquad._API.items():
        module, attr = target.split(":")
        obj = getattr(importlib.import_module(module), attr)
        text = _text(sections[name])
        if isinstance(obj, dict):
            for key in obj:
                assert f"| {key} |" in text, (name, key)
        elif not isinstance(obj, type):
            assert f"moquad.{name}(" in text, name
            if attr != name:
                assert not re.search(rf"(?<![\w.]){attr}\(", text), name
    page = _text((site / "reference" / "api.html").read_text().split('<article', 1)[1].split("</article>")[0])
    page = re.sub(r"\w+\.\w+\(|[\w/]*\.py", " ", page)  # methods (``torch.topk(``), files
    assert not internal_names(page), internal_names(page)


def _results_text() -> str:
    """Every table and note of the results records the pages render (docs/results/*.json)."""
    import json

    out = []
    for p in sorted((DOCS / "results").glob("*.json")):
        for t in json.loads(p.read_text()).get("tables", {}).values():
            out += [" ".join(map(str, row)) for row in t["rows"]] + t.get("notes", [])
    return "\n".join(out)


def test_readme_is_a_front_page_whose_numbers_are_on_the_docs_pages():
    """At most 200 lines; every number in its prose and tables (code left out) appears on a docs page or in a
    results record a page renders."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert not re.search(r"\b[0-9a-f]{7}\b(?![\w.])", readme)
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    prose = re.sub(r"`[^`]*`|\]\([^)]*\)", "", prose)  # inline code, link targets
    docs = "\n".join(p.read_text() for p in DOCS.rglob("*.md")) + _results_text()
    numbers = set(re.findall(r"(?<![\w.])[+−-]?\d[\d,]*(?:\.\d+)?", prose))
    missing = sorted(n for n in numbers if len(n.lstrip("+−-")) > 1 and n.lstrip("+−-") not in docs)
    assert not missing, f"README numbers on no docs page: {missing}"


def test_readme_lists_no_table_by_hand():
    """A list of names (methods, backbones, protocols, datasets, optimizers) goes stale in a README: it links the
    generated tables instead, so no line of its prose names more than two rows of one table."""
    readme = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    for table in ("METHODS", "BACKBONES", "PROTOCOLS", "DATASETS", "OPTIMIZERS"):
        names = getattr(moquad, table)
        for line in readme.splitlines():
            named = [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", line)]
            assert len(named) <= 2, (table, named, line)
        assert f"docs/reference/api.md#moquad.{table}" in readme or table not in ("METHODS", "BACKBONES"), table


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
