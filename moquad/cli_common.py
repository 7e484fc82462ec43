"""What every ``moquad`` command shares: its flags, the error policy, ``--set`` / ``--print-config``, path checks.

Flags: a command with a config (pretrain, preprocess, the evaluation commands, cam, export, motion) is declared
with :func:`config_command` and a list of :class:`Flag`; each flag is generated from its config field (name,
type, help written on the field with ``rule(..., help=...)``, choices, default), so a setting is followed
from the command line in three files: the command's flag list, :mod:`moquad.config`, the module that uses it.

Names start with ``_`` as they did inside ``moquad.cli``: they are the CLI's own plumbing, not an API.

The policy itself (which failures are expected, how they are worded) is :mod:`moquad.errors`;
:func:`_friendly` applies it at the command boundary: an expected failure prints ONE ``error:``
line and exits with code 2, a bug keeps its traceback. ``moquad --debug`` or ``MOQUAD_DEBUG=1``
prints the traceback of the one-line failures too. :class:`OneLineTyper` does the same for usage errors
that Click finds before a command runs (``--epochs three``).

Help: Click's layout (each option's help wrapped beside it, :class:`HelpCommand`, :class:`CommandList`), so a
command with many flags reads in an 80-column terminal; messages name a setting by the running command's flag
(:func:`moquad.errors.command_flags`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import signal
import sys
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import typer

from moquad import config as C
from moquad import settings
from moquad.errors import command_flags, user_message
from moquad.objstore import is_url
from moquad.recipes import find_recipe


def debug_enabled() -> bool:
    """``MOQUAD_DEBUG`` is set to something other than 0 / false / no (``moquad --debug`` sets it)."""
    return os.environ.get("MOQUAD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


OUTPUT_CLOSED_EXIT = 128 + signal.SIGPIPE  # 141: what a shell reports for git or coreutils ended by SIGPIPE


def output_closed(stream: IO | None = None) -> NoReturn:
    """The reader of our output went away (``moquad pretrain ... | head -1``): end quietly, as git and coreutils do
    (they die of SIGPIPE: status 141, no message). Python ignores SIGPIPE, so the write raised BrokenPipeError
    instead; exiting with 141 (rather than dying of the signal) still runs the run's cleanup (loader workers, the
    --out lock). The closed stream becomes /dev/null so Python's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, (stream or sys.stdout).fileno())
    os.close(devnull)
    raise SystemExit(OUTPUT_CLOSED_EXIT)


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: expected failures (:func:`moquad.errors.user_message`) -> one ``error:`` line, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except BrokenPipeError:
            output_closed()
        except Exception as e:
            msg = user_message(e)
            if msg is None:  # a bug keeps its traceback; typer would print a bare EOFError as "Aborted."
                if isinstance(e, EOFError):
                    raise RuntimeError(f"unexpected end of input: {e!r}") from e
                raise
            if debug_enabled():
                traceback.print_exc()
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(2) from None

    return wrapper


class OneLineTyper(typer.Typer):
    """The ``moquad`` app: command-line usage errors (``--epochs three``, an unknown option, a missing one) print
    ONE ``error:`` line and exit 2, like every other expected failure, instead of Typer's boxed panel."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:
            return super().__call__(*args, **kwargs)
        import rich.console  # its consoles catch BrokenPipeError themselves and exit 1: end as output_closed does

        rich.console.Console.on_broken_pipe = lambda console: output_closed(console.file)
        try:
            rv = super().__call__(*args, **{**kwargs, "standalone_mode": False})
        except typer.TyperException as e:  # Click's usage errors (Typer vendors Click)
            if type(e).__name__ == "NoArgsIsHelpError":  # bare `moquad`: the help, as before
                e.show()
                sys.exit(e.exit_code)
            typer.echo(f"error: {usage_line(e)}", err=True)
            sys.exit(2)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


NB_HYPHEN = "\u2011"  # a non-breaking hyphen: one column, as "-", but no place to wrap a line


class WholeWords(typer.Context.formatter_class):  # Click's HelpFormatter (Typer vendors Click)
    """Click's help layout, but no line breaks inside a word at its hyphen (``--print-config``, ``--nproc-per-node``):
    the text is wrapped with its hyphens held as :data:`NB_HYPHEN`, which the finished help gives back."""

    def write_text(self, text: str) -> None:
        super().write_text(text.replace("-", NB_HYPHEN))

    def write_dl(self, rows: Sequence[tuple[str, str]], *args: Any, **kwargs: Any) -> None:
        super().write_dl([(a.replace("-", NB_HYPHEN), b.replace("-", NB_HYPHEN)) for a, b in rows], *args, **kwargs)

    def getvalue(self) -> str:
        return super().getvalue().replace(NB_HYPHEN, "-")


class HelpContext(typer.Context):
    formatter_class = WholeWords


class HelpCommand(typer.core.TyperCommand):
    """Every ``moquad`` command: its ``--help`` in Click's layout (:class:`WholeWords`), a positional named in
    capitals as its help texts name it (``moquad synth [OPTIONS] OUT``)."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if isinstance(p, typer.core.TyperArgument) and p.metavar is None and p.name:
                p.metavar = p.name.upper()


class CommandList(typer.core.TyperGroup):
    """``moquad --help`` lists each command with the whole first paragraph of its help, wrapped (Click's list cuts
    it at the first full stop or at one line: "Draw loss, learning rate and the Fig.")."""

    context_class = HelpContext

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, " ".join((cmd.help or "").split("\n\n")[0].split())) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def usage_line(e: typer.TyperException) -> str:
    """Click's message on one line, with where to look: ``Invalid value for '--epochs': 'three' is not a valid
    integer (see `moquad pretrain --help`)``."""
    text = " ".join(e.format_message().split()).rstrip(".")
    ctx = getattr(e, "ctx", None)
    return f"{text} (see `{ctx.command_path} --help`)" if ctx is not None else text


_SET = typer.Option(
    None, "--set", metavar="KEY=VALUE",
    help="Any setting, repeatable, dotted for nested ones: --set loader.dilations=1,4. Wins over the named "
         "flags and the recipe. --print-config lists every setting; the Python API page of the docs explains each.")
_PRINT = typer.Option(
    False, "--print-config",
    help="Print the resolved config as YAML and exit.")


def _printed(cfg: Any, print_config: bool) -> bool:
    """Print ``cfg`` as YAML when ``--print-config`` was given; True means the command is done."""
    if print_config:
        typer.echo(C.dump(cfg), nl=False)
    return print_config


def global_options(
    debug: bool = typer.Option(False, "--debug", envvar="MOQUAD_DEBUG",
                               help="Show the full traceback of one-line errors too (or MOQUAD_DEBUG=1)."),
) -> None:
    """The options before the command name (``moquad --debug pretrain ...``)."""
    if debug:
        os.environ["MOQUAD_DEBUG"] = "1"


def _text(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _field(cls: type, key: str) -> tuple[Any, dataclasses.Field, Any]:
    """Setting ``key`` of config class ``cls`` (dotted: ``loader.frames``): the config that holds it (defaults),
    its dataclass field, its annotation."""
    obj: Any = cls()
    *outer, name = key.split(".")
    for part in outer:
        obj = getattr(obj, part)
    f = next(f for f in dataclasses.fields(obj) if f.name == name)
    return obj, f, C.type_hints(type(obj))[name]


def flag_help(cls: type, key: str, text: str | None = None, show_default: bool = True) -> str:
    """The help of setting ``key`` of ``cls``: ``text`` (default: the field's ``help=``), then what the config
    says of it: its choices and its default. Flags default to None ("not given": the recipe's value or the
    config's), so typer cannot show the default itself, and help strings never restate a number the
    dataclass holds."""
    obj, f, _ = _field(cls, key)
    text = f.metadata["help"] if text is None else text
    names = f.metadata.get("choices") or settings.choices(type(obj), f.name)  # fixed choices, or a table's rows
    listed = names and all(f"{n}: " in text or f"{n} (" in text for n in names)  # each one said: "NAME: what"
    choices = f" One of: {', '.join(map(str, names))}." if names and not listed else ""
    value = getattr(obj, f.name)
    show_default = show_default and value != "" and not (value is None and "default:" in text)  # said in words
    shown = f" (default: {_text(value)})" if show_default else ""  # not [..]: rich would read markup
    return f"{text}{choices}{shown}"


@dataclasses.dataclass(frozen=True)
class Flag:
    """A named flag of a command that sets config setting ``key`` (dotted for nested ones: ``loader.frames``).

    The rest comes from the field: the flag's name (``--frames``; ``--x/--no-x`` for a bool), its type, its
    help (``help=`` of :func:`moquad.config.rule`) followed by the config's choices and default. A command
    states only what differs there. Not given, a flag is None: the recipe's value or the default stands."""

    key: str
    help: str | None = None  # instead of the field's (a text that means something else in this command)
    decls: tuple[str, ...] = ()  # instead of --<field name>: "--out", "-o"; "--resume" (a switch alone)
    required: bool = False  # no default: the command needs it
    argument: bool = False  # positional
    option: str | None = None  # a positional that may be given as this option instead (export: --checkpoint)
    also: tuple[str, ...] = ()  # settings that take the same value (pretrain --seed: loader.seed)
    alias: str | None = None  # a hidden, deprecated name that still works (preprocess --split)
    parse: Callable[[str], Any] | None = None  # text -> value (a tuple setting: default "1,4" -> (1, 4))
    multiple: bool = False  # a tuple setting given by repeating the flag (--pair A|B --pair C|D)

    @property
    def param(self) -> str:
        """The Python name of the option: the first of ``decls``, else the key (``loader__frames``)."""
        return self.decls[0].split("/")[0].lstrip("-").replace("-", "_") if self.decls else self.key.replace(".", "__")


HELP_WIDTH = 120  # the widest a command's --help gets in a wide terminal (Click's default stops at 80)
RECIPE = "recipe"  # in a command's flags: where its --recipe goes
_KW = inspect.Parameter.KEYWORD_ONLY


def _decls(cls: type, flag: Flag) -> tuple[str, ...]:
    """The names of ``flag`` on the command line: its ``decls``, else ``--<field name>`` (``--x/--no-x`` for a bool)."""
    _, f, hint = _field(cls, flag.key)
    if flag.decls:
        return flag.decls
    name = "--" + f.name.replace("_", "-")
    return (f"{name}/--no-{name[2:]}",) if C.unwrap_optional(hint)[0] is bool else (name,)


def flag_names(cls: type, flags: Sequence[Flag | str]) -> dict[str, str]:
    """Setting -> the flag that sets it in a command of ``flags`` (``epochs`` -> ``--epochs``, ``sync_bn`` ->
    ``--sync-bn/--no-sync-bn``; positionals only by their option): how its messages name them
    (:func:`moquad.errors.setting`)."""
    out = {}
    for flag in flags:
        if isinstance(flag, Flag) and (not flag.argument or flag.option):
            name = flag.option if flag.argument else _decls(cls, flag)[0]
            out.update({key: name for key in (flag.key, *flag.also)})
    return out


def _flag_parameters(cls: type, flag: Flag) -> list[inspect.Parameter]:
    """The typer parameter(s) of ``flag``: its option (or argument), and its hidden alias."""
    hint = _field(cls, flag.key)[2]
    tp, optional = C.unwrap_optional(hint)
    metavar = None
    if typing.get_origin(tp) is tuple:
        tp = list[str] if flag.multiple else str
    elif optional and tp in (int, float) and not flag.argument:  # read as text: `none` resets it (_flag_values)
        tp, metavar = str, f"<{tp.__name__}|none>"
    decls = _decls(cls, flag)
    switch = tp is bool and "/" not in decls[0]  # --resume: off unless given
    text = flag_help(cls, flag.key, flag.help, show_default=not (flag.required or flag.argument or switch))
    if flag.also:
        text = text.replace(" (default: ", f" Also sets {', '.join(flag.also)}. (default: ", 1)
    if flag.argument and flag.option:  # either the positional or the option: one of them is needed
        params = [inspect.Parameter(flag.param, _KW, annotation=tp | None, default=typer.Argument(
                      None, help=f"{text} Or give it as {flag.option}.", show_default=False)),
                  inspect.Parameter(flag.param + "__option", _KW, annotation=tp | None, default=typer.Option(
                      None, flag.option, help=f"The same as the argument {flag.param.upper()}.", show_default=False))]
    elif flag.argument:
        params = [inspect.Parameter(flag.param, _KW, default=typer.Argument(..., help=text), annotation=tp)]
    else:
        option = typer.Option(... if flag.required else None, *decls, help=text, metavar=metavar)
        params = [inspect.Parameter(flag.param, _KW, default=option, annotation=tp if flag.required else tp | None)]
    if flag.alias:
        params.append(inspect.Parameter(flag.param + "__alias", _KW, annotation=tp | None,
                                        default=typer.Option(None, flag.alias, hidden=True)))
    return params


def _argument_or_option(flag: Flag, argument: Any, option: Any) -> Any:
    """The value of a positional that may also be given as ``flag.option``: one of them, or both alike."""
    name = flag.param.upper()
    if argument is not None and option is not None and argument != option:
        raise C.ConfigError(flag.key, "", f"{name} {argument} and {flag.option} {option} differ; give one of them")
    if argument is None and option is None:
        raise C.ConfigError(flag.key, "", f"missing {name} (or {flag.option} {name})")
    return argument if argument is not None else option


RESET = "none"  # an optional setting's flag given ``none``: back to None (its documented meaning), as --set does


def _flag_values(cls: type, flag: Flag, kw: dict[str, Any]) -> dict[str, Any]:
    """The settings ``flag`` gives (popped from the command's keywords ``kw``); None: not given, :data:`RESET`:
    given as ``none`` (an optional setting set to None)."""
    value = kw.pop(flag.param)
    if flag.argument and flag.option:
        value = _argument_or_option(flag, value, kw.pop(flag.param + "__option"))
    alias = kw.pop(flag.param + "__alias", None) if flag.alias else None
    if None not in (value, alias) and value != alias:
        new = "--" + flag.param.replace("_", "-")
        raise C.ConfigError(flag.key, "", f"{flag.alias} is the old name of {new}; give one of them")
    value, hint = alias if value is None else value, _field(cls, flag.key)[2]
    tp, optional = C.unwrap_optional(hint)
    if isinstance(value, list):
        value = tuple(value) or None
    elif isinstance(value, str) and optional and not flag.argument and value.strip().lower() in ("none", "null"):
        value = RESET
    elif isinstance(value, str) and flag.parse is not None:
        value = flag.parse(value)
    elif isinstance(value, str) and (typing.get_origin(tp) is tuple or tp in (int, float)):  # "1,4" -> (1, 4)
        value = C.parse_text(flag.key, hint, value)
    return {key: value for key in (flag.key, *flag.also)}


def _recipe_option(stage: str) -> inspect.Parameter:
    option = typer.Option(None, help=f"Recipe: a name (`moquad recipes --stage {stage}`) or a YAML file; flags "
                          "override it.")
    return inspect.Parameter("recipe", _KW, default=option, annotation=str | None)


def config_command(app: typer.Typer, name: str, cls: type, flags: Sequence[Flag | str], *, epilog: str,
                   stage: str | None = None, check: Callable[[Any], None] | None = None,
                   start: Callable[[Any], Any | None] | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register ``body(cfg, **own)`` as command ``name`` of ``app``. Its options, in this order: ``flags``
    (:class:`Flag` for a config setting, ``RECIPE`` for ``--recipe`` of ``stage``, the name of one of the body's
    own options to place it), the body's other own options, ``--set`` and ``--print-config``. The config:
    defaults < recipe < flags < ``--set`` (:func:`moquad.settings.resolve`); ``start(cfg)``, when it gives a
    config, replaces the defaults (``pretrain --resume``: the run's own settings, flags still over them);
    ``--print-config`` prints the result, else ``check(cfg)`` (paths the command reads) and the body run."""

    def wrap(body: Callable[..., Any]) -> Any:
        own = {p.name: p.replace(kind=_KW) for p in list(inspect.signature(body, eval_str=True).parameters.values())[1:]}
        named = [f for f in flags if isinstance(f, Flag)]
        names = flag_names(cls, named)
        params = [p for entry in flags for p in (
            [_recipe_option(stage or "")] if entry == RECIPE else [own.pop(entry)] if isinstance(entry, str)
            else _flag_parameters(cls, entry))]
        params += [*own.values(), inspect.Parameter("sets", _KW, default=_SET, annotation=list[str] | None),
                   inspect.Parameter("print_config", _KW, default=_PRINT, annotation=bool)]

        def command(**kw: Any) -> None:
            given = {k: v for f in named for k, v in _flag_values(cls, f, kw).items()}
            resets = [f"{k}=none" for k, v in given.items() if v is RESET]  # before the command's own --set
            given = {k: v for k, v in given.items() if v is not RESET}
            named_recipe = kw.pop("recipe", None)
            recipe = _recipe(named_recipe, stage or "")
            sets = [*resets, *(kw.pop("sets") or ())]
            cfg = settings.resolve(cls(), recipe, given, sets)
            base = start(cfg) if start is not None else None
            if base is not None:
                cfg = settings.resolve(base, recipe, given, sets)
            if named_recipe and "recipe" in {f.name for f in dataclasses.fields(cls)}:  # results record it
                cfg = dataclasses.replace(cfg, recipe=named_recipe)
            if _printed(cfg, kw.pop("print_config")):
                return
            with command_flags(names):  # messages name this command's flags, not the config's fields
                if check is not None:
                    check(cfg)
                body(cfg, **kw)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__name__, command.__doc__ = name, body.__doc__
        app.command(name, epilog=epilog)(_friendly(command))
        return body

    return wrap


def _default_of(fn: Callable[..., Any], name: str) -> Any:
    """The default of parameter ``name`` of ``fn``: a command that calls ONE function takes its defaults from it
    (typer shows them) instead of restating them."""
    return inspect.signature(fn).parameters[name].default


def _recipe(recipe: str | None, stage: str) -> str | None:
    """A ``--recipe`` value as a file: a path as given, or a recipe name of ``stage`` (``moquad recipes``)."""
    return None if recipe is None else str(find_recipe(recipe, stage))


def _need_dir(path: str, what: str, hint: str) -> None:
    if not is_url(path) and not Path(path).is_dir():
        raise FileNotFoundError(f"{what} {path} is not a directory; {hint}")


def _need_file(path: str, what: str, hint: str) -> None:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} {path} not found; {hint}")
