"""What every ``moquad`` command shares: the error policy, the ``--set`` / ``--print-config`` options, path checks.

Names start with ``_`` as they did inside ``moquad.cli``: they are the CLI's own plumbing, not an API.

The policy itself (which failures are expected, how they are worded) is :mod:`moquad.errors`;
:func:`_friendly` applies it at the command boundary: an expected failure prints ONE ``error:``
line and exits with code 2, a bug keeps its traceback. ``moquad --debug`` or ``MOQUAD_DEBUG=1``
prints the traceback of the one-line failures too.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from moquad import config as C
from moquad.errors import user_message
from moquad.objstore import is_url


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


def _need_dir(path: str, what: str, hint: str) -> None:
    if not is_url(path) and not Path(path).is_dir():
        raise FileNotFoundError(f"{what} {path} is not a directory; {hint}")


def _need_file(path: str, what: str, hint: str) -> None:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} {path} not found; {hint}")


_DATA = typer.Option(..., help="Shard folder of the evaluation dataset.")
_CKPT = typer.Option(..., help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt).")
_RECIPE = typer.Option(None, help="YAML recipe (eval/*.yaml); flags override it.")


def _eval_cfg(data: str, checkpoint: str, recipe: str | None, sets: list[str] | None, **flags: Any) -> C.EvalConfig:
    """The evaluation commands' config: defaults < recipe < flags (None: not given) < ``--set``."""
    _need_dir(data, "data folder", "run `moquad preprocess` first and pass its --out folder")
    _need_file(checkpoint, "checkpoint", "pass a .pt written by `moquad pretrain` (RUN/checkpoints/last.pt)")
    return C.resolve(C.EvalConfig(), recipe, dict(data=data, checkpoint=checkpoint, **flags), sets or ())
