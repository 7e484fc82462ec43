"""The product speaks of itself only: no page, code comment, constant, test or Makefile line speaks of the work that
made it (work sessions, device calls, ``$OUT``, paths of a development machine, numbered issues, the tools used
to build it, the people who did), and no hand-written page holds a commit hash or a date in its prose (history
goes to the changelog; measured figures come with their date from their results record)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the product must not say; each pattern with the reason a reader would stumble on it
FORBIDDEN = {
    r"(?<![\w.\"'=/-])sessions?\b(?![\w\"'(=-])": "a work session (the product has runs, jobs and allocations)",
    r"\bdevice calls?\b": "a device call of the tooling (a user has a GPU job or allocation)",
    r"\$OUT\b": "the tooling's output folder",
    r"/work/": "a path of the development machine (paths are relative to the repository)",
    r"\bissues? #?\d+": "a numbered issue of the tracker (say what changed instead)",
    r"\bthe `?run`? tool\b": "the tooling",
    r"\bengineers?\b": "the people who built it (say 'a shared machine')",
    r"\bthis round\b": "a round of work",
}
TEXT = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".sh", ".sbatch", ".cfg", ".css", ".js", ".cff", ""}
SELF = Path(__file__).resolve()
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def files() -> list[Path]:
    """The repository's text files: tracked, and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    paths = [ROOT / p for p in out]
    return [p for p in paths if p.is_file() and p.resolve() != SELF and (p.suffix in TEXT or p.name == "Makefile")
            and "golden" not in p.parts]


def hits(text: str) -> list[str]:
    """``line: what`` for every forbidden phrase of ``text``."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern, why in FORBIDDEN.items():
            m = re.search(pattern, line, flags=re.IGNORECASE)
            if m:
                found.append(f"{n}: {m.group(0)!r} ({why})")
    return found


def prose(markdown: str) -> str:
    """A page's prose: fenced code blocks and inline code left out (a hash or a date there is data, not prose)."""
    markdown = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)
    markdown = re.sub(r"^    .*$", "", markdown, flags=re.M)  # indented code blocks
    return re.sub(r"`[^`]*`", "", markdown)  # inline code may wrap a line


def test_the_checkers_find_what_they_look_for():
    bad = ("# a comment from this session\nOUT=$OUT on a device call\nsee /work/shared/data and issue 32\n"
           "the run tool; other engineers")
    assert len(hits(bad)) == 7
    fine = ('@pytest.fixture(scope="session")\nboto3.session.Session()\nAWS_SESSION_TOKEN\nstart_new_session=True\n'
            "a SLURM allocation, its output folder, ../shared/data, the issue tracker")
    assert hits(fine) == []
    page = "Measured at 730e449 on 2026-11-27.\n\n```\nsha256 84c06fe73e3d 2026-11-27\n```\n`ab12cd3` and cafe12345."
    assert HASH.findall(prose(page)) == ["730e449", "cafe12345"] and DATE.findall(prose(page)) == ["2026-11-27"]


def test_no_file_speaks_of_how_it_was_made():
    found = {str(p.relative_to(ROOT)): hits(p.read_text(errors="replace")) for p in files()}
    found = {k: v for k, v in found.items() if v}
    assert not found, "\n".join(f"{k}:{h}" for k, v in found.items() for h in v)


def test_no_hand_written_page_holds_a_commit_hash_or_a_date():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        text = prose(page.read_text())
        found += [f"{page.relative_to(ROOT)}: {x}" for x in HASH.findall(text) + DATE.findall(text)]
    assert not found, "\n".join(found)


# pages that still name the clips beside the checkout, for a change of their own to rewrite
def test_no_page_help_or_default_points_to_the_clips_beside_the_checkout():
    """``../shared/data`` is beside the checkout in continuous integration alone: a user has no such folder, so no
    page, help text, default or example a user reads names it (tests and benchmarks use it, and skip without it;
    a results record keeps the command as it ran, and a page shows it with the reader's own folder)."""
    read = [ROOT / "README.md", ROOT / "mkdocs.yml", *(ROOT / "docs").rglob("*.md"), *(ROOT / "moquad").rglob("*.py"),
            *(ROOT / "moquad").rglob("*.yaml")]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in read
             for n, line in enumerate(p.read_text().splitlines(), 1) if "shared/data" in line]
    assert found == []
    from typer.testing import CliRunner

    from moquad.cli import app

    assert "shared/data" not in CliRunner().invoke(app, ["synth", "--help"]).output
