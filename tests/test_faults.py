"""Bad input and faults as a new user meets them, each through the CLI in a subprocess.

Every expected failure prints ONE ``error:`` line, exits 2 and leaves nothing half-written; a bug
keeps its traceback. Disk-full cases monkeypatch the write inside a small driver process, so the
tests run unprivileged.
"""

from __future__ import annotations

import errno
import os
import subprocess
import textwrap
from pathlib import Path

import cli_child as clirun
import pytest
import torch

from moquad.config import PreprocessConfig
from moquad.errors import MoquadError, user_message
from moquad.io import remove_stale_temps
from moquad.train import checkpoint

TINY = ["--backbone", "tiny", "--batch-size", "4", "--frames", "4", "--size", "32", "--workers", "0",
        "--device", "cpu", "--warmup-ratio", "0"]


def moquad(*args, driver: str = "", env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m moquad.cli ARGS``; with ``driver``, that Python code runs first (to patch a write)."""
    code = f"{textwrap.dedent(driver)}\nimport sys\nfrom moquad.cli import main\nsys.argv[0] = 'moquad'\nmain()\n"
    argv = ["-c", code, *args] if driver else ["-m", "moquad.cli", *args]
    return clirun.python(*argv, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of an expected failure (rc 2, no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def shards(synth_root, tmp_path_factory) -> Path:
    from moquad.preprocess.run import preprocess

    out = tmp_path_factory.mktemp("faults") / "shards"
    preprocess(PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(out), short_side=32, workers=1),
               quiet=True)
    return out


# ----------------------------------------------------------------------------- recipes and settings


@pytest.mark.parametrize("text, line, problem", [("epochs: [1\n", 2, "expected ',' or ']'"),
                                                 ("lr: : 3\n", 1, "mapping values are not allowed")])
def test_malformed_yaml_recipe(tmp_path, text, line, problem):
    (tmp_path / "r.yaml").write_text(text)
    msg = one_line(moquad("pretrain", "--data", tmp_path, "--recipe", tmp_path / "r.yaml"))
    assert msg.startswith(f"error: recipe {tmp_path / 'r.yaml'} line {line}: ") and problem in msg


def test_recipe_base_cycles(tmp_path):
    (tmp_path / "self.yaml").write_text("base: self.yaml\nepochs: 3\n")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    assert "(self.yaml -> self.yaml)" in one_line(moquad("pretrain", "--data", tmp_path, "--recipe", tmp_path / "self.yaml"))
    assert "(a.yaml -> b.yaml -> a.yaml)" in one_line(moquad("pretrain", "--data", tmp_path, "--recipe", tmp_path / "a.yaml"))


@pytest.mark.parametrize("command, recipe, sets, message", [
    ("pretrain", "epochs: three\n", [], "epochs must be an int, got 'three'"),
    ("pretrain", 'lr: "0.1"\n', [], "lr must be a number, got '0.1'"),
    ("pretrain", "loader: {crop_scale: [0.9, 0.2]}\n", [], "loader.crop_scale must not decrease"),
    ("pretrain", "loader: {size: big}\n", [], "loader.size must be an int, got 'big'"),
    ("preprocess", "short_side: big\n", [], "short_side must be an int, got 'big'"),
    ("pretrain", "", ["epochs=three"], "epochs must be an int, got 'three'"),
    ("pretrain", "", ["warmup_ratio=1.5"], "warmup_ratio must be <= 1, got 1.5"),
    ("pretrain", "", ["loader.dilations=1,x"], "loader.dilations must be an int, got 'x'"),
    ("pretrain", "", ["loader.nope=1"], "unknown setting 'loader.nope'; valid: loader.ad_intra_neg,"),
    ("retrieve", "", ["crops=2"], "crops must be one of 1, 3, got 2"),
    ("retrieve", "ks: [1, 0]\n", [], "ks must be >= 1, got 0"),
])
def test_wrong_types_and_ranges_rejected_when_the_config_is_built(tmp_path, command, recipe, sets, message):
    (tmp_path / "r.yaml").write_text(recipe or "{}\n")
    (tmp_path / "c.pt").write_bytes(b"")
    where = {"pretrain": ["--data", tmp_path], "preprocess": ["folder", tmp_path, "--out", tmp_path / "o"],
             "retrieve": ["--data", tmp_path, "--checkpoint", tmp_path / "c.pt"]}[command]
    args = [command, *where, "--recipe", tmp_path / "r.yaml", *[a for s in sets for a in ("--set", s)]]
    msg = one_line(moquad(*args))
    assert message in msg
    assert ("(in recipe" in msg) == bool(recipe)
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- checkpoints


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def bad_checkpoints(folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, the reason the error must give)."""
    folder.mkdir(parents=True, exist_ok=True)
    good = folder / "good.pt"
    torch.save({"model": {"w": torch.ones(3)}, "config": {}}, good)
    files = {
        "garbage": (b"\x80\x02garbage" * 100, "not a PyTorch file"),
        "truncated": (good.read_bytes()[: good.stat().st_size // 2], "truncated or corrupted"),
        "empty": (b"", "empty file"),
        "text": (b"hello, I am not a checkpoint\n", "unreadable"),
    }
    out = {}
    for name, (data, reason) in files.items():
        (folder / f"{name}.pt").write_bytes(data)
        out[name] = (folder / f"{name}.pt", reason)
    torch.save({"x": _Evil()}, folder / "evil.pt")
    out["evil"] = (folder / "evil.pt", "refused for safety: it holds a pickled Python object (posix.system)")
    torch.save({"conv.weight": torch.ones(2)}, folder / "state_dict.pt")
    out["state_dict"] = (folder / "state_dict.pt", "a plain state dict: weights without a moquad config; `moquad motion` reads "
                         f"torchvision video weights as ARCH:{folder / 'state_dict.pt'} with ARCH one of r3d_18, "
                         "mc3_18, r2plus1d_18, s3d")
    torch.save([1, 2], folder / "list.pt")
    out["list"] = (folder / "list.pt", "it holds a list, not a checkpoint dict")
    torch.save({"model": {"w": torch.ones(1)}, "config": {"backbone": "tiny", "proj_dim": 8, "proj_hidden": 8}},
               folder / "mismatch.pt")
    out["mismatch"] = (folder / "mismatch.pt", "its weights do not fit the 'tiny' model its config names")
    return out


def test_bad_checkpoint_kinds(tmp_path):
    for name, (path, reason) in bad_checkpoints(tmp_path).items():
        with pytest.raises(MoquadError) as caught:
            checkpoint.load_model(path)
        msg = str(caught.value)
        assert msg.startswith(f"{path} is not a moquad checkpoint ({reason}"), (name, msg)
        assert "\n" not in msg and "weights_only=False" not in msg


@pytest.mark.parametrize("kind", ["empty", "evil"])
def test_bad_checkpoint_through_the_cli(shards, tmp_path, kind):
    """``empty`` printed only 'Aborted.' (typer's answer to an EOFError); ``evil`` must say it was refused."""
    path, reason = bad_checkpoints(tmp_path / "ckpts")[kind]
    msg = one_line(moquad("extract", "--data", shards, "--checkpoint", path, "--out", tmp_path / "e", "--size", 32))
    assert msg.startswith(f"error: {path} is not a moquad checkpoint ({reason}")
    assert not list(tmp_path.rglob("*.lance"))


@pytest.mark.parametrize("command", ["retrieve", "linear", "finetune", "cam"])
def test_every_command_refuses_a_garbage_checkpoint(shards, tmp_path, command):
    path = tmp_path / "g.pt"
    path.write_bytes(b"\x80\x02garbage" * 100)
    args = {"cam": ["cam", "v_Translate_g01_c01", "--data", shards, "--out", tmp_path / "cam.png"],
            "retrieve": ["retrieve", "--data", shards, "--out", tmp_path / "e"]}.get(
        command, [command, "--data", shards, "--out", tmp_path / "e", "--epochs", 1])
    msg = one_line(moquad(*args, "--checkpoint", path, "--size", 32, "--frames", 4))
    assert msg.startswith(f"error: {path} is not a moquad checkpoint (not a PyTorch file")


def test_resume_from_a_garbage_last_pt(shards, tmp_path):
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"\x00" * 100)
    msg = one_line(moquad("pretrain", "--data", shards, "--out", tmp_path / "run", "--resume", "--epochs", 1, *TINY))
    assert msg.startswith(f"error: {last} is not a moquad checkpoint (")
    assert last.read_bytes() == b"\x00" * 100  # left as it was


# ----------------------------------------------------------------------------- full disk, stale temp files

FULL_DISK_ON_SECOND_SAVE = """
    import errno, torch
    real, calls = torch.save, []
    def save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) >= 2:
            f.write(b"half a checkpoint")
            raise {error}
        return real(obj, f, *args, **kwargs)
    torch.save = save
"""
# what torch's zip writer raises when the disk fills (not an OSError)
TORCH_FULL = 'RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4416 vs 4308")'


@pytest.mark.parametrize("error, start", [
    ('OSError(errno.ENOSPC, "No space left on device")', "error: no space left on device while writing {last} ("),
    (TORCH_FULL, "error: could not write {last}: the disk is full or failing ("),
])
def test_pretrain_onto_a_full_disk(shards, tmp_path, error, start):
    run = tmp_path / "run"
    gone = subprocess.Popen(["true"])  # a pid no process has now (a fixed one, 4242, was a live kernel thread)
    gone.wait()
    stale = run / "checkpoints" / f".last.pt.tmp.{gone.pid}"  # left by an earlier write that a full disk interrupted
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 1000)
    result = moquad("pretrain", "--data", shards, "--out", run, "--epochs", 2, "--ckpt-every", 1, *TINY,
                    driver=FULL_DISK_ON_SECOND_SAVE.replace("{error}", error))
    msg = one_line(result)
    last = run / "checkpoints" / "last.pt"
    assert msg.startswith(start.format(last=last))
    assert "MB free" in msg and msg.endswith("free space and re-run with --resume to continue")
    assert "torch" not in msg or "unexpected pos 4416" in msg  # torch's own words, shortened to one line
    assert checkpoint.load(last)["step"] == 1  # the checkpoint before the failed write, intact
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt"]  # no temp file, old or new


CONFIG_WRITE_FAILS = """
    import errno, os
    import moquad.io
    real = os.replace
    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith("config.yaml"):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *args, **kwargs)
    moquad.io.os.replace = replace
"""


def test_stale_temp_files_removed_at_start(shards, tmp_path):
    """A run that fails before its first checkpoint write still clears an earlier run's temp files."""
    run = tmp_path / "run"
    stale = run / "checkpoints" / ".last.pt.tmp.31337"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    (run / "checkpoints" / "notes.tmp.txt").write_text("keep")  # not a checkpoint temp file
    msg = one_line(moquad("pretrain", "--data", shards, "--out", run, "--epochs", 1, *TINY, driver=CONFIG_WRITE_FAILS))
    assert msg.startswith(f"error: no space left on device while writing {run / 'config.yaml'} (")  # an OSError
    assert sorted(p.name for p in stale.parent.iterdir()) == ["notes.tmp.txt"]


def test_remove_stale_temps_only_on_the_main_rank(tmp_path, monkeypatch):
    (tmp_path / ".last.pt.tmp.4194300").write_bytes(b"x")
    (tmp_path / f".last.pt.tmp.{os.getpid()}").write_bytes(b"x")  # this process's own write in flight
    monkeypatch.setenv("RANK", "1")
    assert remove_stale_temps(tmp_path) == [] and (tmp_path / ".last.pt.tmp.4194300").exists()
    monkeypatch.setenv("RANK", "0")
    assert remove_stale_temps(tmp_path) == [tmp_path / ".last.pt.tmp.4194300"]
    assert [p.name for p in tmp_path.iterdir()] == [f".last.pt.tmp.{os.getpid()}"]


# ----------------------------------------------------------------------------- the error policy




def test_user_message_policy(tmp_path):
    """Expected failures get one line (disk errors worded by disk_error where a path is known); bugs get None."""
    cfg = tmp_path / "run" / "config.yaml"
    enospc = user_message(OSError(errno.ENOSPC, "No space left on device", str(cfg)))
    assert enospc.startswith(f"no space left on device while writing {cfg} (") and enospc.endswith(
        "MB free); free space and re-run the same command to resume")
    assert user_message(OSError(errno.EROFS, "Read-only file system", str(cfg))) == (
        f"read-only file system: cannot write {cfg}; choose a writable output folder")
    assert user_message(PermissionError(errno.EACCES, "Permission denied", str(cfg))) == (
        f"permission denied: {cfg}; check its permissions or choose another folder")
    assert user_message(OSError(errno.ENOSPC, "No space left on device")) == (
        "No space left on device; free space or choose another folder, then re-run the same command")
    assert user_message(MoquadError("first line\nsecond")) == "first line"
    assert user_message(FileNotFoundError("x not found")) == "x not found"
    assert user_message(ValueError("")) == "ValueError"
    for bug in (KeyError("k"), ZeroDivisionError(), EOFError(), OSError(errno.EIO, "I/O error"), RuntimeError("r")):
        assert user_message(bug) is None


BUG = """
    import moquad.config
    def dump(cfg):
        raise {exc}("a bug in moquad")
    moquad.config.dump = dump
"""


@pytest.mark.parametrize("exc", ["KeyError", "EOFError", "ZeroDivisionError"])
def test_a_bug_keeps_its_traceback(tmp_path, exc):
    """EOFError included: typer turns a bare one into 'Aborted.' and hides the bug."""
    result = moquad("pretrain", "--data", tmp_path, "--print-config", driver=BUG.replace("{exc}", exc))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "a bug in moquad" in result.stderr
    assert "Aborted" not in result.stderr and "error: " not in result.stderr


def test_debug_shows_the_traceback_of_one_line_errors(tmp_path):
    plain = moquad("pretrain", "--data", tmp_path, "--set", "epochs=three")
    for result in (moquad("--debug", "pretrain", "--data", tmp_path, "--set", "epochs=three"),
                   moquad("pretrain", "--data", tmp_path, "--set", "epochs=three", env={"MOQUAD_DEBUG": "1"})):
        assert result.returncode == 2 and "Traceback" in result.stderr
        assert result.stderr.rstrip().splitlines()[-1] == plain.stderr.strip()


@pytest.mark.parametrize("args, text", [
    (["pretrain", "--data", ".", "--epochs", "three"], "error: Invalid value for '--epochs': "),
    (["pretrain", "--data", ".", "--no-such-flag"], "error: No such option: --no-such-flag"),
    (["retrieve"], "error: Missing option '--data'"),
    (["pretrian"], "error: No such command 'pretrian'"),
])
def test_usage_errors_are_one_line(args, text):
    """Errors Click finds before a command runs (a typed flag, an unknown option) follow the same policy."""
    msg = one_line(moquad(*args))
    assert msg.startswith(text) and msg.endswith("--help`)"), msg
