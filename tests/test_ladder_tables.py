"""The ladder's summaries (experiments/motion_ladder.py): the paired gains behind docs/guides/methods.md's evidence and
the mean +- std table, against values worked out by hand."""

from __future__ import annotations

import motion_ladder  # experiments/ is on pytest's pythonpath (pyproject.toml)


def _row(family, variant, seed, hit, knn, lin):
    return {"family": family, "variant": variant, "seed": seed, "hit@1": hit, "knn_top1": knn, "linear_top1": lin}


ROWS = [
    _row("types", "moco", 0, 0.30, 0.20, 0.40), _row("types", "moco_moquad", 0, 0.40, 0.30, 0.40),
    _row("types", "moco", 1, 0.50, 0.20, 0.50), _row("types", "moco_moquad", 1, 0.40, 0.40, 0.60),
    _row("types", "moco", 2, 0.10, 0.10, 0.10),  # seed 2 has no moco_moquad: not paired, left out
    _row("camera", "moco", 0, 0.25, 0.25, 0.25), _row("camera", "moco_moquad", 0, 0.50, 0.20, 0.25),
]


def test_compare_is_the_mean_and_std_of_per_seed_differences():
    lines = motion_ladder.compare(ROWS, ["moco:moco_moquad"]).splitlines()
    # types: hit@1 +10, -10 -> +0.0 ± 14.1; kNN +10, +20 -> +15.0 ± 7.1; linear 0, +10 -> +5.0 ± 7.1
    assert lines[2] == "| types | moco_moquad − moco | 0,1 | +0.0 ± 14.1 | +15.0 ± 7.1 | +5.0 ± 7.1 |"
    assert lines[3] == "| camera | moco_moquad − moco | 0 | +25.0 | -5.0 | +0.0 |"  # one seed: no std
    assert len(lines) == 4


def test_table_means_over_seeds():
    lines = motion_ladder.table(ROWS).splitlines()
    assert "| types | moco | 0,1,2 | 30.0 ± 20.0 | 16.7 ± 5.8 | 33.3 ± 20.8 | – |" in lines


def test_the_momentum_slot_variants_train_what_they_name(tmp_path):
    """``demo-M+slot=NAME``: the demo recipe's run of M with the slot's setting, resolved as the ladder resolves it;
    ``demo-M`` keeps its row's defaults."""
    from moquad import config as C
    from moquad.quickstart import demo_pretrain_config

    want = {"first": (False, "batch"), "predictor": (True, "batch"), "split": (True, "split"), None: (None, None)}
    for method in ("moco", "moco_moquad"):
        for slot, (predictor, key_bn) in want.items():
            name = f"demo-{method}" + (f"+slot={slot}" if slot else "")
            row, sets = motion_ladder.VARIANTS[name]
            cfg = demo_pretrain_config(tmp_path, tmp_path / "run", row, None, 0)
            cfg = C.update(cfg, C.parse_sets(cfg, sets))
            assert (row, cfg.predictor, cfg.key_bn, cfg.queue_size, cfg.batch_size) == \
                (method, predictor, key_bn, 128, 16), name


def test_the_ladder_stops_before_a_run_once_the_stop_file_exists(tmp_path, monkeypatch, capsys):
    (tmp_path / "STOP").touch()
    monkeypatch.setattr(motion_ladder, "family_data", lambda *a: tmp_path / "shards")
    monkeypatch.setattr(motion_ladder, "run_variant", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    monkeypatch.setattr("sys.argv", ["motion_ladder.py", "--out", str(tmp_path / "out"), "--families", "types",
                                     "--variants", "demo-moco+slot=split", "--stop", str(tmp_path / "STOP")])
    motion_ladder.main()
    assert "exists: stopped before types seed 0 demo-moco+slot=split" in capsys.readouterr().out
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_the_shipped_momentum_slot_is_the_best_setting_over_the_families():
    """Each momentum row's slot (predictor, keys' BatchNorm) is the setting of highest mean kNN and linear over the
    three families in docs/results/momentum_defaults.jsonl, the record the methods page shows."""
    import json

    from test_records import RESULTS, results_pages

    from moquad.train.methods import METHODS

    pages = results_pages()
    rows = [json.loads(line) for line in (RESULTS / "momentum_defaults.jsonl").open()]
    # the setting each variant ran: demo-M the rows' slot when the record was made (the predictor, groups of 4)
    ran = {"": (True, "groups")}
    for name, sets in motion_ladder.SLOTS.items():
        slot = dict(a.split("=") for a in sets)
        ran[f"+slot={name}"] = (slot["predictor"] == "true", slot["key_bn"])
    for method in ("moco_moquad", "moco"):
        names = {f"demo-{method}{suffix}": setting for suffix, setting in ran.items()}
        chosen = pages.best(rows, list(names), ["types", "directions", "camera"])
        assert chosen is not None, f"{method}: the record lacks runs; every setting needs 3 seeds of each family"
        m = METHODS[method].momentum
        assert (m.predictor, m.key_bn) == names[chosen], (method, chosen)
