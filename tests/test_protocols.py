"""The evaluation protocol table (every evaluation command, cam and the motion report included) and the CLI flags
generated from it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer
import yaml
from typer.testing import CliRunner

from moquad import cli_eval
from moquad import config as C
from moquad.cli import app
from moquad.cli_common import Flag
from moquad.eval.protocols import PROTOCOLS

runner = CliRunner()


def _setting(key: str, config: type = C.EvalConfig):
    cfg = config()
    for part in key.split("."):
        assert part in {f.name for f in dataclasses.fields(cfg)}, key
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_each_protocol_runs_a_function_of_cfg_and_names_real_settings(name):
    proto = PROTOCOLS[name]
    fn = proto.runner()
    assert callable(fn) and "cfg" in inspect.signature(fn).parameters
    for key in proto.flags:
        _setting(key, proto.config)  # every named flag is a setting of the row's config


def test_every_evaluation_command_is_a_row_made_from_it():
    """cam and motion are rows like the others: every command of the evaluation module but export is a protocol,
    and each one's options are what its row names (made by cli_eval.protocol_flags), in one mechanism."""
    commands = {c.name for c in cli_eval.app.registered_commands}
    assert commands - {"export"} == set(PROTOCOLS)
    for name, row in PROTOCOLS.items():
        keys = [f.key for f in _command_flags(name) if isinstance(f, Flag)]
        inputs = ["data", *(["checkpoint"] if row.needs_checkpoint else [])]
        assert keys == [*inputs, *row.flags], name
    assert PROTOCOLS["motion"].needs_checkpoint is None and PROTOCOLS["motion"].config is C.MotionConfig


def _command_flags(name: str) -> tuple:
    """The flags command ``name`` was made with: its own spelling where it has one, else its row's."""
    return getattr(cli_eval, f"{name.upper()}_FLAGS", None) or cli_eval.protocol_flags(name)


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_cli_command_has_the_protocols_flags_with_the_configs_defaults(name):
    command = typer.main.get_command(app).commands[name]
    options = {o: p for p in command.params for o in p.opts}
    spelt = {f.key: f for f in _command_flags(name) if isinstance(f, Flag)}
    for key in PROTOCOLS[name].flags:
        flag = spelt[key].decls[0] if spelt[key].decls else "--" + key.split(".")[-1].replace("_", "-")
        assert flag in options, (name, flag)
        default = _setting(key, PROTOCOLS[name].config)  # shown at the end of the help (cli_common.flag_help)
        text = " ".join(options[flag].help.split())
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        assert text.endswith(f"(default: {shown})") or (default is None and "(default: " in text), text  # in words


def _printed(*args) -> dict:
    result = runner.invoke(app, [*map(str, args), "--print-config"])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output)


def test_nested_flags_and_precedence(tmp_path):
    """A protocol's --epochs sets ITS epochs; defaults < recipe (eval/cpu_demo.yaml) < flags < --set."""
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"")
    got = _printed("finetune", "--data", tmp_path, "--checkpoint", ckpt, "--recipe", "eval/cpu_demo.yaml",
                   "--epochs", 7, "--set", "finetune.lr=0.002")
    assert got["finetune"]["epochs"] == 7 and got["finetune"]["optimizer"] == "adamw"  # flag, recipe
    assert got["finetune"]["lr"] == 0.002 and got["linear"]["epochs"] == C.LinearConfig().epochs
    got = _printed("linear", "--data", tmp_path, "--checkpoint", ckpt, "--epochs", 5, "--batch-size", 4)
    assert (got["linear"]["epochs"], got["linear"]["batch_size"]) == (5, 4)
    assert got["finetune"] == C.to_dict(C.FinetuneConfig()) and got["batch_size"] == C.EvalConfig().batch_size
    got = _printed("retrieve", "--data", tmp_path, "--checkpoint", ckpt, "--no-center", "--knn-k", 3)
    assert (got["center"], got["knn_k"]) == (False, 3)


def test_finetune_from_random_init_needs_no_checkpoint_flag(tmp_path):
    got = _printed("finetune", "--data", tmp_path, "--init", "random", "--backbone", "tiny", "--out", tmp_path / "o")
    assert got["checkpoint"] == "" and got["finetune"]["init"] == "random" and got["finetune"]["backbone"] == "tiny"
    for args in (["finetune"], ["retrieve"], ["finetune", "--backbone", "tiny"]):  # init checkpoint: one is needed
        result = runner.invoke(app, [*args, "--data", str(tmp_path)])
        assert result.exit_code == 2 and "needs --checkpoint" in result.output, result.output
