"""Every command has --help with an example; bad arguments give one line and exit code 2; every setting is
reachable from the command line (named flags and --set), in the documented order of precedence."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing

import cli_child as clirun
import pytest
import yaml
from typer.testing import CliRunner

from moquad import config as C
from moquad import settings
from moquad.cli import app
from moquad.recipes import load_recipe

runner = CliRunner()
COMMANDS = ["synth", "preprocess", "verify", "pretrain", "plot", "extract", "retrieve", "linear", "attentive", "finetune",
            "cam", "motion", "quickstart", "recipes"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_example(command):
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Example" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["preprocess", "kinetics", "{tmp}", "--out", "{tmp}/o"], "dataset must be one of k400, ucf101, hmdb51, ssv2, "
                                                                  "folder, got 'kinetics'"),
        (["preprocess", "ucf101", "{tmp}/missing", "--out", "{tmp}/o"], "dataset root"),
        (["verify", "{tmp}/missing"], "data folder"),
        (["pretrain", "--data", "{tmp}/missing"], "run `moquad preprocess` first"),
        (["pretrain", "--data", "{tmp}", "--method", "byol"], "method must be one of moquad, simclr, simclr_classic, moco, moco_moquad, got 'byol'"),
        (["pretrain", "--data", "{tmp}", "--set", "epochs"], "--set 'epochs' must look like KEY=VALUE"),
        (["pretrain", "--data", "{tmp}", "--set", "epochs.x=1"], "unknown setting 'epochs.x': epochs has no sub-settings"),
        (["linear", "--data", "{tmp}", "--checkpoint", "{tmp}/none.pt"], "{tmp}/none.pt not found; give "
         "RUN/checkpoints/last.pt, an exported .safetensors, torchvision:ARCH[:WEIGHTS] or hf:FOLDER_OR_HUB_NAME"),
        (["pretrain", "--data", "{tmp}", "--recipe", "{tmp}/nope.yaml"], "recipe"),
        (["retrieve", "--data", "{tmp}", "--checkpoint", "{tmp}/none.pt"], "checkpoint"),
        (["synth", "{tmp}/s", "--classes", "50"], "--classes"),
        (["preprocess", "ucf101", "{tmp}", "--out", "{tmp}/o"], "ucfTrainTestlist/ (the official split files) not "
         "found at {tmp}/ucfTrainTestlist; ucf101 expects UCF-101/<Class>/*.avi"),
        (["recipes", "--stage", "training"], "--stage 'training': choose one of preprocess, train, eval"),
        (["pretrain", "--data", "{tmp}", "--recipe", "cpu_demo_typo"], "recipe cpu_demo_typo not found"),
        # a choice of every kind: a table's row, the config's fixed choices, a range; in every kind of command
        (["pretrain", "--data", "{tmp}", "--appearance-op", "blur"], "loader.appearance_op must be one of rad_inter,"),
        (["pretrain", "--data", "{tmp}", "--motion-ops", "speed,warp"], "loader.motion_ops must be one of speed,"),
        (["pretrain", "--data", "{tmp}", "--device", "tpu"], "device must be one of auto, cpu, cuda, got 'tpu'"),
        (["preprocess", "hmdb51", "{tmp}", "--out", "{tmp}/o", "--official-split", "4"], "official_split must be <= 3"),
        (["export", "{tmp}/c.pt", "--out", "{tmp}/m.pt", "--format", "onnx"], "format must be one of torchvision, "
                                                                            "safetensors, got 'onnx'"),
        (["motion", "{tmp}/c.pt", "--data", "{tmp}", "--device", "tpu"], "device must be one of cpu, cuda, got 'tpu'"),
        (["cam", "v.avi", "--checkpoint", "{tmp}/c.pt", "--device", "tpu"], "device must be one of auto, cpu, cuda"),
    ],
)
def test_bad_arguments_one_line(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = clirun.python("-m", "moquad.cli", *args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message.replace("{tmp}", str(tmp_path)) in lines[0], \
        result.stderr
    assert "Traceback" not in result.stderr


CONFIG_COMMANDS = ["preprocess", "pretrain", "extract", "retrieve", "linear", "finetune"]


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
def test_set_and_print_config_documented(command):
    out = runner.invoke(app, [command, "--help"], terminal_width=200).output
    assert "--set" in out and "KEY=VALUE" in out and "--print-config" in out


def cli(*args) -> subprocess.CompletedProcess:
    return clirun.python("-m", "moquad.cli", *map(str, args))


def printed_config(*args) -> dict:
    result = cli(*args, "--print-config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_every_pretrain_setting_reachable_and_precedence(tmp_path):
    """defaults < recipe < named flags < --set; each of the config's fields can be set with --set."""
    (tmp_path / "r.yaml").write_text("epochs: 7\nlr: 1.5\nloader: {frames: 8, size: 64}\n")
    got = printed_config("pretrain", "--data", tmp_path, "--recipe", tmp_path / "r.yaml", "--epochs", 9, "--size", 48,
                         "--set", "lr=0.5", "--set", "loader.size=40", "--set", "loader.dilations=1,4",
                         "--set", "loader.crop_scale=0.6,1.0", "--set", "loader.donors_per_sample=4",
                         "--set", "loader.color_strength=0.25", "--set", "steps_per_epoch=none")
    assert got["epochs"] == 9  # flag beats recipe
    assert got["lr"] == 0.5 and got["loader"]["size"] == 40  # --set beats recipe and flag
    assert got["loader"]["frames"] == 8  # recipe beats default
    assert got["loader"]["dilations"] == [1, 4] and got["loader"]["crop_scale"] == [0.6, 1.0]
    assert (got["loader"]["donors_per_sample"], got["loader"]["color_strength"], got["steps_per_epoch"]) == (4, 0.25, None)
    assert got["batch_size"] == C.PretrainConfig().batch_size  # untouched default


def different(tp, value, rules):
    """A valid value other than ``value`` for a field of annotation ``tp``, and its command-line text."""
    tp, _ = C.unwrap_optional(tp)
    if rules.get("choices") and isinstance(value, tuple):  # a list of choices, e.g. loader.motion_ops
        new = (next(c for c in rules["choices"] if c not in value),)
    elif rules.get("choices"):
        new = next(c for c in rules["choices"] if c != value)
    elif typing.get_origin(tp) is tuple and value is None:  # an optional tuple, e.g. split_ratios
        new = (0.5, 0.5)
    elif typing.get_origin(tp) is tuple:
        new = value[:-1] if len(value) > 2 else tuple(v / 2 for v in value)
    elif tp is bool:
        new = not value
    elif tp is int:
        new = max(5, rules.get("ge", 0)) if value is None else value + 1
    elif tp is float:
        new = 12.5 if value is None else value / 2
    else:
        new = f"x{value or ''}"
    text = ",".join(map(str, new)) if isinstance(new, tuple) else str(new)
    return (list(new) if isinstance(new, tuple) else new), text


@pytest.mark.parametrize("kind, command", [(C.PretrainConfig, "pretrain"), (C.EvalConfig, "finetune"),
                                           (C.PreprocessConfig, "preprocess")])
def test_every_field_settable_with_set(tmp_path, kind, command):
    """One --set per field of the config (nested ones dotted), each to a value other than its default."""
    want, sets = {}, []
    nested = [(getattr(kind(), f.name), f"{f.name}.") for f in dataclasses.fields(kind)
              if dataclasses.is_dataclass(C.type_hints(kind)[f.name])]  # loader.*, linear.*, finetune.*
    for cfg, prefix in [(kind(), ""), *nested]:
        hints = C.type_hints(type(cfg))
        for f in dataclasses.fields(cfg):
            if dataclasses.is_dataclass(hints[f.name]):
                continue
            rules = {**f.metadata, "choices": f.metadata.get("choices") or settings.choices(type(cfg), f.name)}
            new, text = different(hints[f.name], getattr(cfg, f.name), rules)  # table rows: the owner's table
            want[prefix + f.name], sets = new, [*sets, "--set", f"{prefix}{f.name}={text}"]
    (tmp_path / "c.pt").write_bytes(b"")
    where = {"pretrain": ["--data", tmp_path], "finetune": ["--data", tmp_path, "--checkpoint", tmp_path / "c.pt"],
             "preprocess": ["folder", tmp_path, "--out", tmp_path / "o"]}[command]
    got = printed_config(command, *where, *sets)
    for _, prefix in nested:
        got.update({f"{prefix}{k}": v for k, v in got.pop(prefix[:-1]).items()})
    assert got == want


def test_recipe_by_name_and_split_flag(tmp_path):
    got = printed_config("pretrain", "--data", tmp_path, "--recipe", "ucf101_r3d18_moquad")
    assert (got["epochs"], got["backbone"]) == (800, "r3d_18")  # Table 1's UCF101 row, by name after pip install
    assert printed_config("pretrain", "--data", tmp_path, "--recipe", "cpu_demo")["backbone"] == "tiny"  # train's
    (tmp_path / "c.pt").write_bytes(b"")
    got = printed_config("retrieve", "--data", tmp_path, "--checkpoint", tmp_path / "c.pt", "--recipe", "cpu_demo")
    want = C.update(C.EvalConfig(), {**load_recipe("eval/cpu_demo.yaml"), "data": str(tmp_path),
                                     "checkpoint": str(tmp_path / "c.pt"), "recipe": "cpu_demo"})
    assert got == C.to_dict(want)  # eval's cpu_demo (the name is in two stages: the command picks its own)
    got = printed_config("preprocess", "hmdb51", tmp_path, "--out", tmp_path / "o", "--official-split", 2)
    assert got["official_split"] == 2 and "split" not in got
    # --split, the flag's earlier name, still works but is hidden: --split names a manifest split elsewhere
    got = printed_config("preprocess", "hmdb51", tmp_path, "--out", tmp_path / "o", "--split", 3)
    assert got["official_split"] == 3
    assert "--split " not in runner.invoke(app, ["preprocess", "--help"], terminal_width=200).output
    both = runner.invoke(app, ["preprocess", "hmdb51", str(tmp_path), "--out", str(tmp_path / "o"), "--split", "2",
                               "--official-split", "3"])
    assert both.exit_code == 2 and both.output.strip().splitlines() == [
        "error: --split is the old name of --official-split; give one of them"]


def test_recipes_lists_every_packaged_recipe():
    from moquad.recipes import list_recipes

    out = runner.invoke(app, ["recipes"], terminal_width=250).output
    for r in list_recipes():
        assert r["name"] in out
    only = runner.invoke(app, ["recipes", "--stage", "preprocess"], terminal_width=250).output
    assert "ucf101_small" in only and "ucf101_r3d18_moquad" not in only


def _option_helps(command: str) -> dict[str, str]:
    import typer.main

    cmd = typer.main.get_command(app).commands[command]
    return {p.opts[0]: " ".join((p.help or "").split()) for p in cmd.params if isinstance(p.opts, list) and p.opts}


@pytest.mark.parametrize("kind, command", [(C.PretrainConfig, "pretrain"), (C.PreprocessConfig, "preprocess"),
                                           (C.MotionConfig, "motion")])
def test_help_shows_the_config_default_and_restates_none(kind, command):
    """Each flag's help ends with the dataclass default (the one place it is written) and repeats no default."""
    cfg = C.to_dict(kind())
    flat = {**cfg, **{f"loader.{k}": v for k, v in cfg.pop("loader", {}).items()}}
    checked = 0
    for opt, text in _option_helps(command).items():
        name = opt.lstrip("-").split("/")[0].replace("-", "_")
        key = next((k for k in (name, f"loader.{name}") if k in flat), None)
        if key is None or "(default: " not in text:
            continue
        value = flat[key]
        if value is None and not text.endswith("(default: none)"):  # a None default said in words
            continue
        shown = ",".join(map(str, value)) if isinstance(value, list) else "none" if value is None else \
            str(value).lower() if isinstance(value, bool) else str(value)
        body, _, tail = text.rpartition("(default: ")
        body = body.split(" One of: ")[0]  # the choices, read from the config too, list the default
        body = re.sub(r"(?<![\w.])[a-z0-9_]+: ", "", body)  # so does a table's rows listed as NAME: summary
        assert tail == f"{shown})", (opt, text)
        if not isinstance(value, bool) and value is not None:
            assert not re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])", body), f"{opt} restates {shown}: {text}"
        checked += 1
    assert checked >= {"pretrain": 20, "preprocess": 10}.get(command, 8)


# ----------------------------------------------------------------------------- one flag mechanism


def _config_commands():
    from moquad import cli, cli_eval

    return [("pretrain", C.PretrainConfig, cli.PRETRAIN_FLAGS), ("preprocess", C.PreprocessConfig, cli.PREPROCESS_FLAGS),
            ("motion", C.MotionConfig, cli_eval.MOTION_FLAGS)]


def test_every_pretrain_setting_has_a_flag():
    """Each top-level PretrainConfig field has a named flag (the loader's: the listed ones, the rest via --set)."""
    from moquad.cli import PRETRAIN_FLAGS
    from moquad.cli_common import Flag

    keys = {f.key for f in PRETRAIN_FLAGS if isinstance(f, Flag)}
    want = {f.name for f in dataclasses.fields(C.PretrainConfig) if f.name != "loader"}
    assert want <= keys, sorted(want - keys)
    assert all(k in want or k.startswith("loader.") for k in keys)
    opts = _option_helps("pretrain")
    assert {"--model-input", "--split", "--proj-dim", "--log-every", "--appearance-op", "--motion-ops"} <= set(opts)


@pytest.mark.parametrize("command, kind, flags", _config_commands())
def test_flag_help_comes_from_the_field(command, kind, flags):
    """A flag that states no help of its own shows the field's ``help=`` (config.py), then choices and default."""
    from moquad.cli_common import Flag, _field

    helps = {" ".join(p.help.split()) for p in typer_params(command) if getattr(p, "help", None)}
    own = [f for f in flags if isinstance(f, Flag) and f.help is None]
    assert len(own) >= 10
    for flag in own:
        text = _field(kind, flag.key)[1].metadata["help"]
        assert any(h.startswith(text) for h in helps), (flag.key, text)


def typer_params(command: str) -> list:
    import typer.main

    return typer.main.get_command(app).commands[command].params


def test_flags_of_every_config_command_have_a_field():
    """Every named flag of a config command names a field that exists and has a help text."""
    from moquad.cli_common import Flag, _field

    for _, kind, flags in _config_commands():
        for flag in flags:
            if isinstance(flag, Flag):
                assert "help" in _field(kind, flag.key)[1].metadata or flag.help, flag.key


OPTIMIZER_KEYS = ("optimizer", "lr", "weight_decay", "lr_warmup_epochs")  # moquad.train.optimizers.pretrain_optimizer


def _setting_of(printed: dict, key: str):
    return printed[key] if "." not in key else printed["loader"][key.split(".")[1]]


def test_optional_flags_accept_none(tmp_path):
    """An optional setting is reset through its own flag (``--steps-per-epoch none``), not only with --set: every
    optional non-switch flag of the config commands given ``none`` gives None over a recipe's value; --set still
    wins over it, and a bad number is one error line."""
    from moquad.cli_common import Flag, _field

    where = {"pretrain": ["--data", tmp_path], "preprocess": ["folder", tmp_path, "--out", tmp_path / "o"],
             "motion": [tmp_path / "c.pt", "--data", tmp_path]}
    checked = []
    for command, kind, flags in _config_commands():
        unset = yaml.safe_load(runner.invoke(app, [command, *map(str, where[command]), "--print-config"]).output)
        for flag in flags:
            if not isinstance(flag, Flag) or flag.argument or flag.multiple or flag.decls:
                continue
            tp, optional = C.unwrap_optional(_field(kind, flag.key)[2])
            if not optional or tp is bool:
                continue
            opt = "--" + flag.key.split(".")[-1].replace("_", "-")
            result = runner.invoke(app, [command, *map(str, where[command]), opt, "none", "--print-config"])
            assert result.exit_code == 0, (opt, result.output)
            got = yaml.safe_load(result.output)
            now, before = (_setting_of(c, flag.key) for c in (got, unset))
            # None, or what a table row fills for it (pre-training's optimizer settings: the backbone's)
            assert now == before and (now is None or flag.key in OPTIMIZER_KEYS), opt
            checked.append(opt)
    assert {"--steps-per-epoch", "--fps", "--limit", "--max-videos"} <= set(checked), checked
    (tmp_path / "r.yaml").write_text("steps_per_epoch: 5\n")
    assert printed_config("pretrain", "--data", tmp_path, "--recipe", tmp_path / "r.yaml", "--steps-per-epoch",
                          "none")["steps_per_epoch"] is None
    assert printed_config("pretrain", "--data", tmp_path, "--steps-per-epoch", "none", "--set",
                          "steps_per_epoch=7")["steps_per_epoch"] == 7
    bad = cli("pretrain", "--data", tmp_path, "--steps-per-epoch", "x", "--print-config")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: steps_per_epoch must be an int, got 'x'"


def test_sync_bn_help_says_what_none_means():
    """``(default: none)`` alone told nothing: the help says none is on with more than one rank and BatchNorm."""
    text = _option_helps("pretrain")["--sync-bn"]
    assert "none: on with more than one rank and a BatchNorm backbone" in text and text.endswith("(default: none)")


@pytest.mark.parametrize("args", [["recipes"], ["pretrain", "--data", "DATA", "--print-config"],
                                  ["pretrain", "--data", "DATA", "--out", "OUT", "--backbone", "tiny", "--batch-size",
                                   "4", "--frames", "4", "--size", "32", "--workers", "0", "--device", "cpu",
                                   "--epochs", "1"]])
def test_a_closed_stdout_ends_quietly_with_141(tmp_path, args):
    """``moquad ... | head -1``: the reader is gone before the command writes (its end of the pipe closed first,
    so the first write fails). Ends as git and coreutils do: no message, status 141 (128 + SIGPIPE) - rich's
    consoles (recipes, pretrain's report) and plain prints (--print-config) alike (before: status 1)."""
    import os

    from video_fixtures import coded_dataset

    data = coded_dataset(tmp_path / "data", num_videos=8, num_frames=12, videos_per_shard=4) if "DATA" in args else None
    args = [str(data) if a == "DATA" else str(tmp_path / "run") if a == "OUT" else a for a in args]
    r, w = os.pipe()
    os.close(r)  # `head` has read its line and gone
    try:
        done = subprocess.run([sys.executable, "-m", "moquad.cli", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=300)
    finally:
        os.close(w)
    assert (done.returncode, done.stderr) == (141, ""), done.stderr


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    from test_features import make_tiny_dataset

    return make_tiny_dataset(tmp_path_factory.mktemp("cli") / "data", {"train": 4, "test": 4}, frames=8)


@pytest.mark.parametrize("case, args, message", [
    ("raw", ["pretrain", "--data", "{tmp}/raw", "--out", "{tmp}/run"],
     "this looks like raw videos: run `moquad preprocess folder {tmp}/raw --out OUT` first, then pass --data OUT"),
    ("raw", ["info", "{tmp}/raw"],
     "this looks like raw videos: run `moquad preprocess folder {tmp}/raw --out OUT` first"),
    ("ucf101", ["pretrain", "--data", "{tmp}/UCF101", "--out", "{tmp}/run"],
     "this looks like ucf101's raw layout: run `moquad preprocess ucf101 {tmp}/UCF101 --out OUT --official-split 1` "
     "first, then pass --data OUT"),
    ("hmdb51", ["finetune", "--data", "{tmp}/hmdb51", "--init", "random", "--backbone", "tiny", "--out", "{tmp}/m"],
     "this looks like hmdb51's raw layout: run `moquad preprocess hmdb51 {tmp}/hmdb51 --out OUT --official-split 1` "
     "first, then pass --data OUT"),
    ("shards", ["pretrain", "--data", "{data}/shards", "--out", "{tmp}/run"],
     "this is the shards/ folder of a dataset: pass its parent, --data {data}"),
    ("sd", ["motion", "--data", "{data}", "{tmp}/sd.pt", "--out", "{tmp}/m"],
     "{tmp}/sd.pt is not a moquad checkpoint (a plain state dict: weights without a moquad config; `moquad motion` "
     "reads torchvision video weights as ARCH:{tmp}/sd.pt with ARCH one of r3d_18, mc3_18, r2plus1d_18, s3d, swin3d_t, "
     "mvit_v2_s)"),
    ("recipe", ["pretrain", "--data", "{data}", "--recipe", "eval/cpu_demo.yaml"],
     "eval/cpu_demo.yaml is an evaluation recipe (for `moquad retrieve`, `linear`, `attentive`, `finetune`, "
     "`extract` or `cam`), "
     "not a pre-training recipe; use it there, or give this one a pre-training recipe (`moquad recipes --stage "
     "train` lists them)"),
    ("recipe", ["retrieve", "--data", "{data}", "--checkpoint", "{tmp}/sd.pt", "--recipe", "train/cpu_demo.yaml"],
     "train/cpu_demo.yaml is a pre-training recipe (for `moquad pretrain`), not an evaluation recipe"),
])
def test_error_lines_point_to_the_fix(tiny_data, tmp_path, case, args, message):
    """The mistakes a new user makes: the raw video folder (a known dataset's: its own preprocess command) or the
    shards/ folder as --data, torchvision
    weights without ARCH:, a recipe of another stage: one line that names the fix, exit code 2, no output."""
    import torch

    (tmp_path / "raw" / "walk").mkdir(parents=True)
    (tmp_path / "raw" / "walk" / "v01.mp4").write_bytes(b"\x00" * 64)
    for name in ("UCF101/UCF-101/Walk/v_Walk_g01_c01.avi", "UCF101/ucfTrainTestlist/classInd.txt",
                 "hmdb51/walk/a_walk_f_nm_np1_ba_goo_0.avi", "hmdb51/testTrainMulti_7030_splits/walk_test_split1.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\x00" * 64)
    torch.save({"conv.weight": torch.ones(2)}, tmp_path / "sd.pt")
    fill = {"{tmp}": str(tmp_path), "{data}": str(tiny_data)}
    args = [re.sub("{tmp}|{data}", lambda m: fill[m[0]], a) for a in args]
    result = clirun.python("-m", "moquad.cli", *args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.sub("{tmp}|{data}", lambda m: fill[m[0]], message) in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "m").exists()


# ----------------------------------------------------------------------------- help at 80 columns


HELP_LINES = 120  # the most lines a command's --help may take at 80 columns (pretrain, the longest, shows ~45 flags)


def _help_at(columns: int, *command: str) -> list[str]:
    import os

    result = clirun.python("-m", "moquad.cli", *command, "--help", env={**os.environ, "COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_every_help_reads_at_80_columns():
    """Each --help fits an 80-column terminal in at most HELP_LINES lines, every option's help beside it at least
    40 columns wide (rich's panels once squeezed pretrain's into 20 columns over 276 lines); a wide terminal gets
    fewer, longer lines (up to 120 columns)."""
    import typer.main

    names = list(typer.main.get_command(app).list_commands(None))
    for command in ([], *([n] for n in names)):
        lines = _help_at(80, *command)
        assert len(lines) <= HELP_LINES and max(map(len, lines)) <= 80, (command, len(lines))
        indents = [len(line) - len(line.lstrip()) for line in lines if line.startswith(" " * 12)]
        assert max(indents, default=0) <= 34, command  # an option's help wraps in the 44 columns beside it
    pretrain, wide = _help_at(80, "pretrain"), _help_at(120, "pretrain")
    assert 100 <= len(pretrain) <= HELP_LINES and len(wide) < 0.7 * len(pretrain) and max(map(len, wide)) <= 120
    assert max(len(line) - 34 for line in pretrain if line.startswith(" " * 34)) >= 40


def test_help_is_complete():
    """pretrain --help names every flag of the command (none hidden but an old alias) and says where every other
    setting is; ``moquad --help`` gives each command's whole summary."""
    import typer.main

    text = "\n".join(_help_at(80, "pretrain"))
    cmd = typer.main.get_command(app).commands["pretrain"]
    shown = [opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts) if not getattr(p, "hidden", False)]
    assert len(shown) > 45 and [opt for opt in shown if opt not in text] == []
    assert "--print-config lists every setting" in " ".join(text.split())
    assert "Draw loss, learning rate and the Fig. 4 rank diagnostic of a run to a PNG." in " ".join(
        "\n".join(_help_at(80)).split())
