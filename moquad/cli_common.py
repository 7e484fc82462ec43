"""What every ``moquad`` command shares: the error policy, the ``--set`` / ``--print-config`` options, path checks.

Names start with ``_`` as they did inside ``moquad.cli``: they are the CLI's own plumbing, not an API.

The policy itself (which failures are expected, how they are worded) is :mod:`moquad.errors`;
:func:`_friendly` applies it at the command boundary: an expected failure prints ONE ``error:``
line and exits with code 2, a bug keeps its traceback. ``moquad --debug`` or ``MOQUAD_DEBUG=1``
prints the traceback of the one-line failures too. :class:`OneLineTyper` does the same for usage errors
that Click finds before a command runs (``--epochs three``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from moquad import config as C
from moquad import settings
from moquad.errors import user_message
from moquad.objstore import is_url
from moquad.recipes import find_recipe


def debug_enabled() -> bool:
    """``MOQUAD_DEBUG`` is set to something other than 0 / false / no (``moquad --debug`` sets it)."""
    return os.environ.get("MOQUAD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: expected failures (:func:`moquad.errors.user_message`) -> one ``error:`` line, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
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


def usage_line(e: typer.TyperException) -> str:
    """Click's message on one line, with where to look: ``Invalid value for '--epochs': 'three' is not a valid
    integer (see `moquad pretrain --help`)``."""
    text = " ".join(e.format_message().split()).rstrip(".")
    ctx = getattr(e, "ctx", None)
    return f"{text} (see `{ctx.command_path} --help`)" if ctx is not None else text


_SET = typer.Option(
    None, "--set", metavar="KEY=VALUE",
    help="Any setting of the config, repeatable, dotted for nested ones: --set loader.dilations=1,4 "
         "--set loader.crop_scale=0.6,1.0. Applied after the named flags, so it wins over them.")
_PRINT = typer.Option(
    False, "--print-config",
    help="Print the resolved config (defaults < recipe < flags < --set) as YAML and exit without running.")


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


def _cfg_help(cls: type, key: str, text: str) -> str:
    """``text`` plus what the config says of setting ``key`` (dotted: ``loader.frames``): its choices and its
    default. Flags default to None ("not given": the recipe's value or the config's), so typer cannot show
    the default itself, and help strings never restate a number the dataclass holds."""
    obj: Any = cls()
    *outer, name = key.split(".")
    for part in outer:
        obj = getattr(obj, part)
    meta = next(f.metadata for f in dataclasses.fields(obj) if f.name == name)
    names = meta.get("choices") or settings.choices(type(obj), name)  # fixed choices, or the rows of a table
    choices = f" One of: {', '.join(map(str, names))}." if names else ""
    return f"{text}{choices} (default: {_text(getattr(obj, name))})"  # not [..]: rich would read markup


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


_DATA = typer.Option(..., help="Shard folder of the evaluation dataset.")
_CKPT = typer.Option(..., help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt).")
_RECIPE = typer.Option(None, help="Recipe: a name (`moquad recipes --stage eval`) or a YAML file; flags override it.")


def _eval_cfg(data: str, checkpoint: str, recipe: str | None, sets: list[str] | None, **flags: Any) -> C.EvalConfig:
    """The evaluation commands' config: defaults < recipe < flags (None: not given) < ``--set``."""
    _need_dir(data, "data folder", "run `moquad preprocess` first and pass its --out folder")
    _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)")
    return settings.resolve(C.EvalConfig(), _recipe(recipe, "eval"), dict(data=data, checkpoint=checkpoint, **flags), sets or ())
