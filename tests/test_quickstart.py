"""The demo end to end at a token budget: every stage runs and the table, JSON and PNG are written."""

from __future__ import annotations

import json
from pathlib import Path

import cli_child as clirun
import pytest
import yaml

from moquad import config as C
from moquad.quickstart import KS, _finished, demo_eval_config, demo_pretrain_config, quickstart
from moquad.train import checkpoint


def test_quickstart_writes_comparison(tmp_path):
    results = quickstart(tmp_path / "qs", epochs=2, classes=2, per_class=4, seed=1)
    assert list(results) == ["random init", "simclr", "moquad"]
    saved = json.loads((tmp_path / "qs" / "comparison.json").read_text())
    assert saved["chance_top1"] == 0.5
    for method, r in results.items():
        assert saved[method] == r and set(r) >= {"hit@1", "knn_top1", "linear_top1"}
        assert 0.0 <= r["hit@1"] <= r["hit@5"] <= r["hit@10"] <= 1.0
        assert all(0.0 <= r[m] <= 1.0 for m in ("knn_top1", "linear_top1"))
    # the table's numbers are the evaluation's own results
    ret = json.loads((tmp_path / "qs" / "eval" / "moquad" / "retrieval.json").read_text())
    lin = json.loads((tmp_path / "qs" / "eval" / "moquad" / "linear_fast.json").read_text())
    assert results["moquad"]["hit@1"] == ret["top1"] and results["moquad"]["linear_top1"] == lin["top1"]
    assert (tmp_path / "qs" / "comparison.png").stat().st_size > 5000
    assert (tmp_path / "qs" / "moquad" / "curves.png").is_file()
    # the motion report of the same three networks on the test split (moquad.eval.motion)
    motion = json.loads((tmp_path / "qs" / "motion" / "motion.json").read_text())
    assert list(motion["encoders"]) == ["random init", "simclr", "moquad"] and motion["data"]["split"] == "test"
    assert all(0.0 <= r["appearance_share"] <= 1.0 + 1e-9 for r in motion["encoders"].values())
    assert (tmp_path / "qs" / "motion" / "motion.png").stat().st_size > 20000
    for method in ("simclr", "moquad"):  # a finished run's checkpoint says so (_finished counts its last epoch)
        last = tmp_path / "qs" / method / "checkpoints" / "last.pt"
        assert checkpoint.load(last)["epoch"] == 2 and _finished(last, 2) and not _finished(last, 3)
    untrained = checkpoint.load(tmp_path / "qs" / "random" / "checkpoints" / "last.pt")  # the floor: not resumable
    assert (untrained["step"], untrained["epoch"]) == (0, -1) and "optimizer" not in untrained
    assert json.loads((tmp_path / "qs" / "quickstart.json").read_text())["kind"] == "types"  # every stamp names it
    # a second call reuses data and finished runs instead of redoing them
    again = quickstart(tmp_path / "qs", epochs=2, classes=2, per_class=4, seed=1)
    assert again == results
    # ... and refuses to mix in data or runs made with other settings
    with pytest.raises(ValueError, match="other settings"):
        quickstart(tmp_path / "qs", epochs=3, classes=2, per_class=4, seed=1)


def cli_config(*args) -> dict:
    result = clirun.python("-m", "moquad.cli", *map(str, args), "--print-config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_demo_is_two_recipes_the_cli_reproduces(tmp_path):
    """`moquad pretrain/retrieve` with train/ and eval/cpu_demo.yaml resolve to exactly the demo's configs."""
    data, ckpt = tmp_path / "shards", tmp_path / "last.pt"
    data.mkdir()
    ckpt.write_bytes(b"")
    for method in ("simclr", "moquad"):
        got = cli_config("pretrain", "--data", data, "--recipe", "train/cpu_demo.yaml", "--method", method,
                         "--out", tmp_path / method)
        assert got == C.to_dict(demo_pretrain_config(data, tmp_path / method, method))
    got = cli_config("pretrain", "--data", data, "--recipe", "train/cpu_demo.yaml", "--method", "moquad", "--out",
                     tmp_path / "m", "--seed", 3, "--backbone", "r3d_18", "--epochs", 40, "--lr-warmup-epochs", 2)
    assert got == C.to_dict(demo_pretrain_config(data, tmp_path / "m", "moquad", epochs=40, seed=3, backbone="r3d_18"))
    got = cli_config("retrieve", "--data", data, "--checkpoint", ckpt, "--recipe", "eval/cpu_demo.yaml",
                     "--out", tmp_path / "eval")
    assert got == C.to_dict(demo_eval_config(data, ckpt, tmp_path / "eval"))
    assert tuple(got["ks"]) == KS


def test_demo_settings():
    """The demo's CPU budget and its two documented departures from the paper (train/cpu_demo.yaml)."""
    cfg = demo_pretrain_config(Path("d"), Path("r"), "moquad")
    assert (cfg.backbone, cfg.epochs, cfg.batch_size, cfg.loader.frames, cfg.loader.size) == ("tiny", 60, 16, 8, 32)
    assert cfg.warmup_ratio == 0.0 and cfg.loader.dilations == (1, 4)
    assert (cfg.hard_beta, cfg.hard_alpha, cfg.temperature, cfg.optimizer) == (0.01, 1.5, 0.1, "lars")  # the paper's
    ev = demo_eval_config(Path("d"), Path("c.pt"), Path("o"))
    assert (ev.num_clips, ev.frames, ev.size, ev.crops, ev.ks) == (5, 8, 32, 1, KS)


def test_finished_means_every_epoch_trained(tmp_path):
    """A checkpoint's ``epoch`` is the epoch its NEXT step belongs to: after N epochs it says N."""
    path = tmp_path / "last.pt"
    for epoch, epochs, done in [(2, 2, True), (1, 2, False), (59, 60, False), (60, 60, True), (-1, 1, False)]:
        checkpoint.save({"model": {}, "config": {}, "epoch": epoch, "step": 0}, path)
        assert _finished(path, epochs) is done, (epoch, epochs)


def test_a_run_is_shown_beside_the_recorded_seeds(tmp_path, monkeypatch, capsys):
    """`make demo` prints its figures beside the seeds' mean ± sample std of the record, and flags a figure more
    than two std away; without a record it prints nothing."""
    import io

    from rich.console import Console

    from moquad import record
    from moquad.quickstart import against_record

    seeds = {"moquad": {"hit@1": [0.40, 0.50, 0.60], "knn_top1": [0.5, 0.5, 0.5], "linear_top1": [0.3, 0.4, 0.5]}}
    (tmp_path / "synth_evidence.json").write_text(json.dumps(
        {"date": "2026-12-06T01:00:00+00:00", "machine": {"cpu": "Some CPU", "cores": 2},
         "figures": {"seeds": [0, 1, 2], "results": {"types": seeds}}}))
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    out = io.StringIO()
    console = Console(file=out, width=200)
    run = {"moquad": {"hit@1": 0.69, "knn_top1": 0.5, "linear_top1": 0.61}}
    verdict = against_record(console, run, "types")
    # hit@1: mean 50.0, std 10.0 -> 69 within 2 std; kNN: std 0 -> 50.0 inside; linear: mean 40, std 10 -> 61 outside
    assert verdict == {("moquad", "hit@1"): True, ("moquad", "knn_top1"): True, ("moquad", "linear_top1"): False}
    text = out.getvalue()
    assert "69.0 [50.0 ± 10.0]" in text and "61.0 [40.0 ± 10.0] outside" in text and "2-core Some CPU" in text
    assert against_record(console, run, "directions") is None  # no seeds of that family recorded
    monkeypatch.setattr(record, "RESULTS", tmp_path / "none")
    assert against_record(Console(file=io.StringIO()), run, "types") is None
