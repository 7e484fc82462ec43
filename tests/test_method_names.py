"""The method table is the only owner of method knowledge: no product module outside moquad/train/methods.py
names a method or a stage (a string equal to one, e.g. ``cfg.method == "simclr_classic"`` or
``mode == "moquad"``). The few strings that equal a name but mean something else are listed here with why."""

from __future__ import annotations

import ast
from pathlib import Path

from moquad.train.methods import METHODS

PACKAGE = Path(__file__).resolve().parent.parent / "moquad"
TABLE = PACKAGE / "train" / "methods.py"
# (module, string): a string that equals a method or stage name and means something else
NOT_A_METHOD = {
    ("config.py", "moquad"): "the config's default method: config.py sits below the table (settings checks it)",
    ("data/index_cache.py", "moquad"): "the cache folder's name (~/.cache/moquad)",
    ("objstore.py", "moquad"): "the object-store emulator's project id",
    ("cli_eval.py", "pair"): "the motion report's --pair flag",
    ("eval/protocols.py", "pair"): "the motion report's pair option",
    ("eval/encoders/local.py", "moquad"): "the encoder family of moquad's own checkpoints and exports (its row)",
    ("data/views.py", "pair"): "the clip rule a two-clip plan records (moquad.data.clip_frames)",
    ("eval/encoders/contract.py", "moquad"): "the sizing rule of moquad's own test view (a framing, not a method)",
    ("record.py", "moquad"): "the package's folder (uncommitted code there makes a record dirty) and its own name",
}


def names() -> set[str]:
    """Every method's name and every stage's name and label."""
    out = set(METHODS)
    for m in METHODS.values():
        out |= {s.name for s in m.stages} | {s.label for s in m.stages}
    return out


def mentions(root: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(module, line, string) of every string constant equal to a method or stage name outside the table."""
    found, wanted = [], names()
    for path in sorted(root.rglob("*.py")):
        if path == TABLE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted:
                found.append((path.relative_to(root).as_posix(), node.lineno, node.value))
    return found


def test_no_method_or_stage_name_outside_the_table():
    unexpected = [m for m in mentions() if (m[0], m[2]) not in NOT_A_METHOD]
    assert not unexpected, f"method or stage names outside moquad/train/methods.py: {unexpected}"


def test_the_scan_finds_a_name(tmp_path):
    """The scan itself: a module comparing a config's method with a name is found (and only that line)."""
    (tmp_path / "evil.py").write_text('x = 1\nclassic = config.get("method") == "simclr_classic"\n')
    assert mentions(tmp_path) == [("evil.py", 2, "simclr_classic")]
