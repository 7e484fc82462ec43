"""Every command has --help with an example; bad arguments give one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from moquad.cli import app

runner = CliRunner()
COMMANDS = ["synth", "preprocess", "verify", "pretrain", "plot", "extract", "retrieve", "linear", "finetune",
            "cam", "quickstart"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_example(command):
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["preprocess", "kinetics", "{tmp}", "--out", "{tmp}/o"], "unknown dataset 'kinetics'"),
        (["preprocess", "ucf101", "{tmp}/missing", "--out", "{tmp}/o"], "dataset root"),
        (["verify", "{tmp}/missing"], "data folder"),
        (["pretrain", "--data", "{tmp}/missing"], "run `moquad preprocess` first"),
        (["pretrain", "--data", "{tmp}", "--method", "byol"], "unknown method 'byol'"),
        (["pretrain", "--data", "{tmp}", "--recipe", "{tmp}/nope.yaml"], "recipe"),
        (["retrieve", "--data", "{tmp}", "--checkpoint", "{tmp}/none.pt"], "checkpoint"),
        (["synth", "{tmp}/s", "--classes", "50"], "--classes"),
    ],
)
def test_bad_arguments_one_line(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = subprocess.run([sys.executable, "-m", "moquad.cli", *args], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
