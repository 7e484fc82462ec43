"""mkdocs hooks: the pages generated at build time, so they cannot go stale.

- ``cli.md``: ``<!-- moquad:cli -->`` becomes every command's ``--help``, run in this process (typer's test
  runner; importing the CLI imports no torch).
- ``api.md``: ``<!-- moquad:api -->`` becomes one mkdocstrings ``:::`` block per public name of
  ``moquad._API`` (the one table of the public names), grouped by stage.
- Every page: Sphinx roles in docstrings (``:func:`x```) are shown as plain code.
"""

from __future__ import annotations

import os
import re

CLI_MARK = "<!-- moquad:cli -->"
API_MARK = "<!-- moquad:api -->"
GROUPS = (  # (title, module prefixes): the API page's sections, in order
    ("Settings", ("moquad.config", "moquad.settings")),
    ("Data: videos to quadruples", ("moquad.preprocess", "moquad.synth", "moquad.data")),
    ("Pre-training: methods, losses, backbones", ("moquad.train", "moquad.models")),
    ("The motion report", ("moquad.eval.motion",)),
    ("Evaluation", ("moquad.eval", "moquad.export")),
)
WIDTH = "80"  # columns of the help texts: a code block of the site's content column holds ~85
ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj):(<code>)~?")


def _help(app, args: list[str]) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [*args, "--help"], prog_name="moquad", color=False,
                                env={"TERMINAL_WIDTH": WIDTH, "COLUMNS": WIDTH})
    if result.exit_code != 0:
        raise RuntimeError(f"moquad {' '.join(args)} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())


def cli_reference() -> str:
    """Markdown: ``moquad --help`` and every command's ``--help``, in the CLI's own order."""
    os.environ.setdefault("TERMINAL_WIDTH", WIDTH)
    import typer

    from moquad.cli import app

    group = typer.main.get_command(app)
    names = list(group.list_commands(None))  # typer's group keeps registration order
    parts = ["## moquad", "", "```text", _help(app, []), "```", ""]
    for name in names:
        parts += [f"## moquad {name}", "", "```text", _help(app, [name]), "```", ""]
    return "\n".join(parts)


def api_reference() -> str:
    """Markdown: a ``:::`` block per public name, under the section its module belongs to."""
    import moquad

    sections: dict[str, list[str]] = {title: [] for title, _ in GROUPS}
    rows = ["| `moquad.` name | defined in |", "|---|---|"]
    for name, target in moquad._API.items():
        module, attr = target.split(":")
        title = next(t for t, prefixes in GROUPS if module.startswith(prefixes))
        sections[title].append(f"::: {module}.{attr}\n    options:\n      heading: moquad.{name}\n"
                               f"      toc_label: {name}\n")
        rows.append(f"| [`{name}`][{module}.{attr}] | `{module}.{attr}` |")
    body = "\n".join(f"## {title}\n\n" + "\n".join(blocks) for title, blocks in sections.items() if blocks)
    return "\n".join(rows) + "\n\n" + body


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, api_reference())
    return markdown


def on_page_content(html: str, page, config, files) -> str:
    return ROLE.sub(r"\1", html)
