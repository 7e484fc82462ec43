"""mkdocs hooks: the pages generated at build time, so they cannot go stale.

- ``cli.md``: ``<!-- moquad:cli -->`` becomes every command's ``--help``, run in this process (typer's test
  runner; importing the CLI imports no torch).
- ``api.md``: ``<!-- moquad:api -->`` becomes the reference of every name of ``moquad._API`` (the one table of
  the public names), grouped by stage, each under its public name (``moquad.quadruple_views``, whatever its
  module calls it):
  - a function or class: its signature and docstring, read by static analysis (griffe: no torch imported);
  - a config class: one row per setting with its type, default, allowed values and help, read from the
    dataclass field and its rule (``moquad.config.rule``), nothing restated here;
  - a table (a dict of rows: methods, backbones, ops, optimizers, protocols, datasets): one row per entry,
    read from the table itself (:data:`TABLE_COLUMNS` says which columns each shows).
- Every page: Sphinx roles in docstrings (``:func:`x```) are shown as plain code.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

CLI_MARK = "<!-- moquad:cli -->"
API_MARK = "<!-- moquad:api -->"
ROOT = Path(__file__).resolve().parents[1]
GROUPS = (  # (title, module prefixes): the API page's sections, in order
    ("Settings", ("moquad.config", "moquad.settings")),
    ("Data: videos to quadruples", ("moquad.preprocess", "moquad.synth", "moquad.data")),
    ("Pre-training: methods, losses, backbones", ("moquad.train", "moquad.models")),
    ("The motion report", ("moquad.eval.motion",)),
    ("Evaluation", ("moquad.eval", "moquad.export")),
)
WIDTH = "80"  # columns of the help texts: a code block of the site's content column holds ~85
SIGNATURE_WIDTH = 80  # a longer signature is written one parameter per line (a code block shows ~83)
ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj):(<code>)~?")
DOC_ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj):`~?([^`]+)`")


# ----------------------------------------------------------------------------- the CLI page


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


# ----------------------------------------------------------------------------- docstrings and signatures


def doc_markdown(text: str | None) -> str:
    """A docstring as Markdown: Sphinx roles become code (``:func:`x``` -> ``x``), the text is dedented."""
    import inspect

    return DOC_ROLE.sub(r"``\1``", inspect.cleandoc(text or ""))


def summary(text: str | None) -> str:
    """The first sentence of a docstring, on one line."""
    first = " ".join(doc_markdown(text).split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(?=\s+[A-Z(`]|$)", first)  # "Eq. 3" or "e.g. x" end no sentence
    return match.group(1) if match else first


class Signatures:
    """Signatures read by static analysis (griffe) of this checkout's ``moquad``: no module is imported, so
    torch is not either. A parameter's annotation or default that names a module constant or type alias
    (``CAMERA_SPEED``, ``Location``) is shown as its value (``1.5``, ``str | Path``): a reader cannot see the
    name."""

    def __init__(self) -> None:
        import griffe

        self.package = griffe.load("moquad", search_paths=[str(ROOT)], docstring_parser=None)

    def get(self, path: str) -> Any:
        """The griffe object of ``module.attr`` (a dotted path under ``moquad``)."""
        return self.package[path.removeprefix("moquad.")]

    def _text(self, expr: Any) -> str:
        if expr is None or isinstance(expr, str):
            return str(expr)
        parts = []
        for part in expr.iterate(flat=True):
            if isinstance(part, str):
                parts.append(part)
                continue
            target = self._constant(getattr(part, "canonical_path", ""))
            parts.append(target if target is not None else str(part))
        return "".join(parts)

    def _constant(self, path: str) -> str | None:
        """The value of a module-level constant or alias ``path`` of moquad (not a class or function)."""
        if not path.startswith("moquad."):
            return None
        try:
            obj = self.get(path)
        except KeyError:
            return None
        while obj.is_alias:
            try:
                obj = obj.final_target
            except Exception:  # an alias that resolves outside moquad
                return None
        if (obj.kind.value != "attribute" or obj.value is None or obj.parent is None
                or obj.parent.kind.value != "module" or type(obj.value).__name__ == "ExprCall"):
            return None  # a call (``TypeVar("T")``) is no value a reader can use: the name stays
        return self._text(obj.value)

    def signature(self, shown: str, fn: Any, method: bool = False, returns: bool = True) -> str:
        """``shown(params) -> returns`` of griffe function ``fn`` (``self`` dropped for a method; no ``-> ...``
        for a class, whose ``__init__`` this is)."""
        params, star = [], False
        for i, p in enumerate(fn.parameters):
            kind = p.kind.value
            if method and i == 0 and p.name in ("self", "cls"):
                continue
            if kind == "keyword-only" and not star:
                params.append("*")
                star = True
            text = {"variadic positional": "*", "variadic keyword": "**"}.get(kind, "") + p.name
            star = star or kind == "variadic positional"
            if p.annotation is not None:
                text += f": {self._text(p.annotation)}"
            if p.default is not None and not kind.startswith("variadic"):
                text += f" = {self._text(p.default)}" if p.annotation is not None else f"={self._text(p.default)}"
            params.append(text)
            if kind == "positional-only" and (i + 1 == len(fn.parameters)
                                              or fn.parameters[i + 1].kind.value != "positional-only"):
                params.append("/")
        returns = f" -> {self._text(fn.returns)}" if returns and fn.returns is not None else ""
        line = f"{shown}({', '.join(params)}){returns}"
        if len(line) <= SIGNATURE_WIDTH:
            return line
        return f"{shown}(\n" + "".join(f"    {p},\n" for p in params) + f"){returns}"


# ----------------------------------------------------------------------------- config classes


class PublicNames(dict):
    """object -> its public name, for the objects a generated table refers to (a config class nested in another,
    the table a setting chooses from, a stage's view plan): ``public.get(id(obj))`` for a config class or a table
    (imported: their modules load no torch), else found by the ``module:qualname`` ``moquad._API`` names."""

    def __init__(self, api: Mapping[str, str]) -> None:
        super().__init__()
        self.by_target = {target: name for name, target in api.items()}
        for name, target in api.items():
            module, attr = target.split(":")
            if module == "moquad.config" or name in TABLE_COLUMNS:
                self[id(getattr(importlib.import_module(module), attr))] = name

    def of(self, obj: Any) -> str | None:
        return self.get(id(obj)) or self.by_target.get(f"{getattr(obj, '__module__', '')}:"
                                                      f"{getattr(obj, '__qualname__', '')}")


def _type_name(tp: Any) -> str:
    from moquad.config import unwrap_optional

    inner, optional = unwrap_optional(tp)
    if optional:
        return f"{_type_name(inner)} | None"
    if typing.get_origin(inner) is tuple:
        args = typing.get_args(inner)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{_type_name(args[0])}, ...]"
        return f"tuple[{', '.join(_type_name(a) for a in args)}]"
    return getattr(inner, "__name__", str(inner))


def _value(value: Any) -> str:
    return f"`{value!r}`" if not isinstance(value, tuple) else f"`{tuple(value)!r}`"


def _allowed(cls: type, f: dataclasses.Field, public: PublicNames) -> str:
    """What a setting accepts beyond its type: its fixed choices, its bounds, its table (with a link)."""
    from moquad.settings import CHOICES

    rules, out = f.metadata, []
    if "choices" in rules:
        out.append(", ".join(_value(c) for c in rules["choices"]))
    table = CHOICES.get((cls, f.name))
    if table is not None:
        name = public.get(id(table))
        names = ", ".join(f"`{n}`" for n in table)
        out.append(f"a row of [`moquad.{name}`](#moquad.{name}): {names}" if name else names)
    if "ge" in rules and "le" in rules:
        out.append(f"{rules['ge']} to {rules['le']}")
    else:
        out += [f"{word} {rules[key]}" for key, word in (("ge", "≥"), ("gt", ">"), ("le", "≤")) if key in rules]
    if rules.get("ordered"):
        out.append("low ≤ high")
    return "; ".join(out)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def plain(text: str) -> str:
    """Help text (written for the terminal) as Markdown that shows it as written: only its `backticked` spans
    are code; ``*``, ``_``, ``\\``, ``[`` and ``<`` elsewhere are literal."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else re.sub(r"([\\*_\[<])", r"\\\1", p) for p in parts)


def config_rows(cls: type, public: PublicNames, prefix: str = "") -> list[str]:
    """One Markdown table row per setting of config class ``cls``; a nested config that is a public name is one
    row linking to it, any other is expanded (``linear.epochs``)."""
    from moquad.config import type_hints

    hints, rows = type_hints(cls), []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            name = public.get(id(tp))
            if name is None:
                rows += config_rows(tp, public, f"{prefix}{f.name}.")
            else:
                rows.append(f"| `{prefix}{f.name}` | `{name}` = `{name}()` | "
                            f"the settings of [`moquad.{name}`](#moquad.{name}) |")
            continue
        default = _value(f.default) if f.default is not dataclasses.MISSING else "computed"  # a factory: see help
        allowed = _allowed(cls, f, public)
        rows.append(f"| `{prefix}{f.name}` | `{_type_name(tp)}` = {default} | {_cell(plain(f.metadata.get('help', '')))}"
                    + (f"<br>Allowed: {_cell(allowed)}" if allowed else "") + " |")
    return rows


def config_reference(public_name: str, cls: type, public: PublicNames) -> str:
    header = ["| setting | type = default | what it sets |", "|---|---|---|"]
    from moquad.config import SETTINGS_DOC

    summary_doc = (cls.__doc__ or "").split(SETTINGS_DOC)[0]  # the settings themselves: the table below
    return (f"{doc_markdown(summary_doc)}\n\nBuilt with keyword arguments, one per setting "
            f"(`moquad.{public_name}(frames=16, ...)` style); every setting is checked when the config is built, "
            "and by `dataclasses.replace`. A bad value is a `ValueError` naming the setting.\n\n"
            + "\n".join(header + config_rows(cls, public)) + "\n")


# ----------------------------------------------------------------------------- tables


def _doc_of(fn: Any) -> str:
    return summary(getattr(fn, "__doc__", None))


def _stages(method: Any, public: PublicNames) -> str:
    parts = []
    for stage in method.stages:
        views = public.of(stage.views)
        forced = ", ".join(f"`{k}={str(v).lower()}`" for k, v in stage.switches.items())
        parts.append(f"`{stage.name}`: " + (f"`moquad.{views}`" if views else f"`{stage.views.__name__}`")
                     + (f" with {forced}" if forced else ""))
    return "<br>then ".join(parts)


def _losses(method: Any, sigs: Signatures) -> str:
    out = []
    for stage in method.stages:
        if callable(stage.loss):
            out.append(_doc_of(stage.loss))
        else:
            module, _, name = stage.loss.partition(":")
            out.append(summary(sigs.get(f"{module}.{name}").docstring.value))
    return "<br>then ".join(out)


def _momentum(method: Any) -> str:
    m = method.momentum
    if m is None:
        return "none"
    return "EMA encoder" + (", queue of keys" if m.queue else "") + (", predictor" if m.predictor else "")


# public table name -> its columns after the row's name: (title, row -> Markdown)
TABLE_COLUMNS: dict[str, tuple[tuple[str, Callable[..., str]], ...]] = {
    "METHODS": (("stages and their views (Algorithm 1)", lambda r, ctx: _stages(r, ctx["public"])),
                ("loss of each stage", lambda r, ctx: _losses(r, ctx["sigs"])),
                ("momentum encoder", lambda r, ctx: _momentum(r))),
    "BACKBONES": (("what it is", lambda r, ctx: r.description), ("feature size", lambda r, ctx: str(r.dim)),
                  ("torchvision export", lambda r, ctx: "yes" if r.torchvision else ""),
                  ("class-activation map", lambda r, ctx: r.tokens.what if r.tokens else "the last feature map")),
    "APPEARANCE_OPS": (("what it does", lambda r, ctx: r.help), ("its frames come from", lambda r, ctx: r.source)),
    "MOTION_OPS": (("what it does", lambda r, ctx: r.help),
                   ("plays at the second speed m", lambda r, ctx: "yes" if r.second_speed else "")),
    "FLIP_POLICIES": (("what it does", lambda r, ctx: _doc_of(r)),),
    "OPTIMIZERS": (("update", lambda r, ctx: _doc_of(r.build)), ("parameter groups", lambda r, ctx: _doc_of(r.groups))),
    "PROTOCOLS": (("what it measures", lambda r, ctx: r.summary),
                  ("named flags of its command", lambda r, ctx: " ".join(  # a flag is never broken at a hyphen
                      f'<code class="flag">--{f.split(".")[-1].replace("_", "-")}</code>' for f in r.flags))),
    "DATASETS": (("what ROOT must hold", lambda r, ctx: r.layout),
                 ("official splits", lambda r, ctx: ", ".join(map(str, r.official_splits)))),
}


TABLE_TITLES = {  # what each table holds: "The table of ..."
    "METHODS": "pre-training methods", "BACKBONES": "backbones", "APPEARANCE_OPS": "appearance ops",
    "MOTION_OPS": "motion ops", "FLIP_POLICIES": "flip policies", "OPTIMIZERS": "optimizers",
    "PROTOCOLS": "evaluation protocols", "DATASETS": "dataset layouts",
}


def table_reference(name: str, table: Mapping[str, Any], ctx: dict[str, Any]) -> str:
    """A table as a Markdown table, one row per entry, after the settings that name its rows."""
    from moquad.settings import CHOICES

    columns = TABLE_COLUMNS[name]
    lines = [f"| name | {' | '.join(title for title, _ in columns)} |", "|---" * (len(columns) + 1) + "|"]
    for key, row in table.items():
        lines.append(f"| `{key}` | " + " | ".join(_cell(fn(row, ctx)) for _, fn in columns) + " |")
    chosen = [f"`{ctx['public'].get(id(cls), cls.__name__)}.{field}`" for (cls, field), t in CHOICES.items()
              if t is table]
    chosen_by = (f" The setting{'s' * (len(chosen) > 1)} {', '.join(chosen)} name{'s' * (len(chosen) == 1)} "
                 "a row." if chosen else "")
    return (f"The table of {TABLE_TITLES[name]}: a `dict`, name -> row.{chosen_by}\n\n" + "\n".join(lines)
            + "\n\nRead-only here: a new row is added in the module that owns the table "
              "([Extending moquad](../guides/extending.md)).\n")


# ----------------------------------------------------------------------------- the API page


def _members(cls: Any, sigs: Signatures) -> str:
    """A class's public methods and properties (with a docstring), as a definition list, after the names of its
    public attributes."""
    attributes = [n for n, m in cls.members.items() if not n.startswith("_") and m.kind.value == "attribute"
                  and not m.labels & {"property"} and not m.docstring]
    out = [f"Attributes: {', '.join(f'`{n}`' for n in attributes)}.\n"] if attributes else []
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias or not member.docstring:
            continue
        if member.kind.value == "function":
            head = sigs.signature(name, member, method=True)
        elif "property" in member.labels:
            head = f"{name}: {sigs._text(member.annotation)}" if member.annotation is not None else name
        else:
            continue
        body = doc_markdown(member.docstring.value).replace("\n", "\n    ")
        out.append(f"`{' '.join(head.split())}`\n:   {body}\n")
    return "\n".join(out)


def object_reference(name: str, module: str, attr: str, sigs: Signatures, ctx: dict[str, Any]) -> str:
    """The Markdown of public name ``name`` (``module.attr``)."""
    obj = sigs.get(f"{module}.{attr}")
    while obj.is_alias:
        obj = obj.final_target
    if module == "moquad.config" and obj.kind.value == "class":
        return config_reference(name, getattr(importlib.import_module(module), attr), ctx["public"])
    if name in TABLE_COLUMNS:
        return table_reference(name, getattr(importlib.import_module(module), attr), ctx)
    doc = doc_markdown(obj.docstring.value if obj.docstring else "")
    if obj.kind.value == "function":
        return f"```python\n{sigs.signature(f'moquad.{name}', obj)}\n```\n\n{doc}\n"
    init = obj.members.get("__init__")
    sig = sigs.signature(f"moquad.{name}", init, method=True, returns=False) if init is not None else f"moquad.{name}"
    members = _members(obj, sigs)
    return f"```python\n{sig}\n```\n\n{doc}\n" + (f"\n{members}" if members else "")


def api_reference() -> str:
    """Markdown: an index of the public names by stage (name, first sentence), then each one's reference."""
    import moquad

    sigs = Signatures()
    public = PublicNames(moquad._API)
    ctx = {"public": public, "sigs": sigs}
    index: dict[str, list[str]] = {title: [] for title, _ in GROUPS}
    body: dict[str, list[str]] = {title: [] for title, _ in GROUPS}
    for name, target in moquad._API.items():
        module, attr = target.split(":")
        title = next(t for t, prefixes in GROUPS if module.startswith(prefixes))
        obj = sigs.get(f"{module}.{attr}")
        first = summary(obj.docstring.value) if obj.docstring else ""
        if name in TABLE_COLUMNS:
            first = f"The table of {TABLE_TITLES[name]}."
        index[title].append(f"| [`{name}`](#moquad.{name}) | {_cell(first)} |")
        body[title].append(f"### moquad.{name} {{#moquad.{name} data-toc-label=\"{name}\"}}\n\n"
                           + object_reference(name, module, attr, sigs, ctx))
    parts = []
    for title, _ in GROUPS:
        if index[title]:
            parts.append(f"## {title}\n\n| `moquad.` name | what it is |\n|---|---|\n" + "\n".join(index[title])
                         + "\n\n" + "\n".join(body[title]))
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, api_reference())
    return markdown


PUBLIC_CODE = re.compile(r"(<a\b[^>]*>)?<code>(moquad\.(\w+)\b[^<]*)</code>")


def link_public_names(html: str, api_url: str) -> str:
    """Inline code that names a public name (``moquad.make_loader``, ``moquad.make_loader(DATA, ...)``) links to
    its section of the API page; code already inside a link, and code blocks, stay as they are."""
    import moquad

    def link(m: re.Match) -> str:
        if m.group(1) or m.group(3) not in moquad._API:
            return m.group(0)
        return f'<a href="{api_url}#moquad.{m.group(3)}"><code>{m.group(2)}</code></a>'

    return PUBLIC_CODE.sub(link, html)


def on_page_content(html: str, page, config, files) -> str:
    api = files.get_file_from_path("reference/api.md")
    if api is not None:
        html = link_public_names(html, api.url_relative_to(page.file))
    return ROLE.sub(r"\1", html)
