"""The results records (moquad/record.py) and the docs' renderer of them (docs/results_pages.py): a record holds
its tables as printed, its figures, the command, the machine, the load, the date and the commit; a rendered table is
the record's, under one line that says where and when; the ladder's tables are means and paired differences over
seeds; every record the pages name is in the repository (or named as pending) and its tables fit the column."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moquad import record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
# records a page names that another change brings (the methods' ladder and the motion report over its checkpoints)
PENDING = {"methods_ladder.jsonl", "motion_evidence"}
COLUMN = 710  # px of the content column at a 1280-px window (733) a table may take, with a margin


def results_pages():
    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "docs" / "results_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_record_holds_its_tables_command_machine_load_date_and_commit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "bench_x.py"), "--repeats", "2", "--record",
                                      str(tmp_path / "r.json"), "--record=elsewhere"])
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    rec = record.Record("bench_x")
    rec.table("main", ["path", "q/s"], [["shards", "118.5"], ["PyAV", None]], title="Loader", notes=["A note."])
    rec.figures.update(rate=118.5, bad=float("nan"), pair=(1, 2))
    path = rec.write(tmp_path / "r.json")
    out = capsys.readouterr().out
    assert "Loader\n\n| path   |   q/s |\n|--------|------:|\n| shards | 118.5 |\n| PyAV   |     – |\n\nA note." in out
    r = json.loads(path.read_text())
    assert r["name"] == "bench_x" and r["command"] == "python benchmarks/bench_x.py --repeats 2"  # not where it goes
    date = datetime.datetime.fromisoformat(r["date"])
    assert before <= date <= datetime.datetime.now(datetime.timezone.utc)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert r["commit"] == head and isinstance(r["dirty"], bool)
    assert r["machine"]["cores"] == len(os.sched_getaffinity(0)) and r["machine"]["python"]
    assert len(r["load"]) == 3 and len(r["load_end"]) == 3 and r["seconds"] >= 0
    assert r["tables"]["main"] == {"title": "Loader", "columns": ["path", "q/s"], "align": "lr",
                                   "rows": [["shards", "118.5"], ["PyAV", "–"]], "notes": ["A note."]}
    assert r["figures"] == {"rate": 118.5, "bad": None, "pair": [1, 2]}  # strict JSON: NaN is null
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # written atomically, nothing left beside it


def _record(**extra) -> dict:
    return {"name": "bench_x", "command": "python benchmarks/bench_x.py", "date": "2026-01-02T03:04:05+00:00",
            "commit": "0123456789abcdef", "dirty": False, "machine": {"cpu": "AMD EPYC", "cores": 2},
            "load": [7.12, 6.0, 5.0], "load_end": [8.24, 7.0, 6.0],
            "tables": {"main": {"title": "Loader, CPU time", "columns": ["path", "q/s"], "align": "lr",
                                "rows": [["a|b", "1.5"]], "notes": ["A note."]}}, **extra}


def test_a_rendered_table_says_where_and_when_it_was_measured(tmp_path, monkeypatch):
    pages = results_pages()
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    (tmp_path / "bench_x.json").write_text(json.dumps(_record()))
    assert pages.render("# T\n\n<!-- moquad:table bench_x main -->\n") == (
        "# T\n\nLoader, CPU time.\n\n*Measured by `python benchmarks/bench_x.py` on AMD EPYC (2 cores), load "
        "average 7.1 at the start, "
        "8.2 at the end, 2026-01-02, commit 0123456, no lock recorded.*\n\n| path | q/s |\n|---|---:|\n| a\\|b | 1.5 |\n\nA note.\n")
    gpu = _record(command=None, script="experiments/bench_gpu.py", load=None, dirty=True,
                  machine={"gpu": "NVIDIA H200", "cores": 16})
    (tmp_path / "bench_gpu.json").write_text(json.dumps(gpu))
    assert pages.table("bench_gpu", "main").split("\n\n")[1].startswith(
        "*Measured by `experiments/bench_gpu.py` (its options not recorded) on NVIDIA H200 (16 CPU cores), "
        "2026-01-02, commit 0123456 with local changes, no lock recorded.*")


def test_a_missing_record_or_table_names_the_command_that_writes_it(tmp_path, monkeypatch):
    pages = results_pages()
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    text = pages.render("<!-- moquad:table bench_scale loader -->")
    assert text.startswith('!!! warning "Not measured yet"') and "`python benchmarks/bench_scale.py`" in text
    (tmp_path / "bench_x.json").write_text(json.dumps(_record()))
    assert "has no table 'other'" in pages.render("<!-- moquad:table bench_x other -->")


ROWS = [  # (family, variant, seed, hit@1, kNN, linear)
    ("types", "moco", 0, 0.30, 0.20, 0.40), ("types", "moco_moquad", 0, 0.40, 0.30, 0.40),
    ("types", "moco", 1, 0.50, 0.20, 0.50), ("types", "moco_moquad", 1, 0.40, 0.40, 0.60),
    ("types", "moco", 2, 0.10, 0.10, 0.10),  # seed 2 has no moco_moquad: not paired, left out of the gain
    ("camera", "moco", 0, 0.25, 0.25, 0.25), ("camera", "moco_moquad", 0, 0.50, 0.20, 0.25),
]


def test_ladder_tables_are_means_over_seeds_and_paired_gains(tmp_path, monkeypatch):
    pages = results_pages()
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    lines = [{"family": f, "variant": v, "seed": s, "hit@1": h, "knn_top1": k, "linear_top1": lin,
              **({"command": "python experiments/motion_ladder.py --out x", "date": f"2026-01-0{s + 1}T00:00:00",
                  "commit": "abcdef0123", "machine": {"cpu": "AMD EPYC", "cores": 2}} if f == "types" else {})}
             for f, v, s, h, k, lin in ROWS]
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = pages.ladder("l.jsonl", ["families=types", "variants=moco,moco_moquad"]).splitlines()
    assert table[0] == "*5 runs on AMD EPYC (2 cores), 2026-01-01 to 2026-01-03, commit abcdef0, no lock recorded.*"
    assert table[2:5] == ["```bash", "python experiments/motion_ladder.py --out x", "```"]
    # moco on types, seeds 0 1 2: hit@1 30 50 10 -> 30.0 ± 20.0; kNN 20 20 10 -> 16.7 ± 5.8; linear 40 50 10
    assert table[-2:] == ["| types | `moco` | 3 | 30.0 ± 20.0 | 16.7 ± 5.8 | 33.3 ± 20.8 |",
                          "| types | `moco_moquad` | 2 | 40.0 ± 0.0 | 35.0 ± 7.1 | 50.0 ± 14.1 |"]
    gain = pages.ladder_gain("l.jsonl", ["moco:moco_moquad"]).splitlines()
    assert gain[0].startswith("*6 runs on AMD EPYC (2 cores)") and "2 runs not recorded" in gain[0]
    # types: hit@1 +10, -10 -> +0.0 ± 14.1; kNN +10, +20 -> +15.0 ± 7.1; linear 0, +10 -> +5.0 ± 7.1
    assert gain[-2:] == ["| types | `moco_moquad` − `moco` | 2 | +0.0 ± 14.1 | +15.0 ± 7.1 | +5.0 ± 7.1 |",
                         "| camera | `moco_moquad` − `moco` | 1 | +25.0 | -5.0 | +0.0 |"]


def _narrowest(table: dict) -> int:
    """A table's narrowest width on the site, in px: a column is at least 100 px wide (the theme's header minimum)
    or as wide as its longest word (~8 px a character) and its padding; cells wrap at spaces."""
    cols = list(zip(table["columns"], *table["rows"]))
    return sum(max(100, 8 * max(len(w.strip("`")) for c in col for w in str(c).split() or [""]) + 34) for col in cols)


def _markers() -> list[tuple[Path, str, list[str]]]:
    pages = results_pages()
    return [(p, kind, args) for p in sorted((ROOT / "docs").rglob("*.md"))
            for kind, args in pages.markers(p.read_text())]


def test_every_record_the_pages_name_is_here_whole_and_fits_the_column():
    seen = set()
    for page, kind, args in _markers():
        name = args[0]
        if kind == "table":
            path = RESULTS / f"{name}.json"
            if name in PENDING and not path.is_file():
                continue
            assert path.is_file(), f"{page.name}: {name}.json"
            r = json.loads(path.read_text())
            assert (r.get("command") or r.get("script")) and r["date"][:2] == "20" and r["commit"], name
            assert r["machine"].get("cpu") or r["machine"].get("gpu"), name
            assert args[1] in r["tables"], f"{page.name}: {name} has no table {args[1]}"
            t = r["tables"][args[1]]
            assert all(len(row) == len(t["columns"]) for row in t["rows"]), (name, args[1])
            assert _narrowest(t) <= COLUMN, (name, args[1], _narrowest(t))
            seen.add(name)
        elif kind in ("ladder", "ladder-gain"):
            assert (RESULTS / name).is_file() or name in PENDING, f"{page.name}: {name}"
    assert {"bench_preprocess", "bench_loader", "bench_step", "bench_scale", "bench_decoders"} <= seen


@pytest.mark.parametrize("name", sorted(p.stem for p in RESULTS.glob("*.json")))
def test_committed_records_carry_their_provenance(name):
    r = json.loads((RESULTS / f"{name}.json").read_text())
    assert r["name"].startswith(name.split("_")[0]) and r["date"] and r["commit"] and r["machine"]
    assert r.get("command") or r.get("script")


def test_a_variant_name_may_hold_an_equals_sign():
    """``moco:moco+key_bn=groups`` is a pair of variants, not an option; one seed shows its value without a spread."""
    pages = results_pages()
    assert pages._options(["moco:moco+key_bn=groups", "families=types,camera"]) == (
        ["moco:moco+key_bn=groups"], {"families": ["types", "camera"]})
    assert pages._mean_std([25.0]) == "25.0" and pages._mean_std([20.0, 30.0]) == "25.0 ± 7.1"


def test_a_rendered_table_names_the_lock_of_its_record(tmp_path, monkeypatch):
    pages = results_pages()
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    rec = {**_record(), "lock": {"sha256": "902b7fbc1641f71c", "matches": True}}
    (tmp_path / "bench_x.json").write_text(json.dumps(rec))
    assert "commit 0123456, lock 902b7fbc1641.*" in pages.render("<!-- moquad:table bench_x main -->\n")
    rec["lock"]["matches"] = False
    (tmp_path / "bench_x.json").write_text(json.dumps(rec))
    assert "lock 902b7fbc1641 (environment differed from it).*" in pages.render("<!-- moquad:table bench_x main -->\n")


def test_a_command_shows_the_readers_own_clips():
    """A recorded run that read the clips beside the checkout is shown with the reader's own folder of real videos
    (and a line that says what it holds); the record keeps the command as it ran."""
    pages = results_pages()
    ran = ("python experiments/motion_ladder.py --out runs/ladder \\\n    --families camera --source "
           "../shared/data/real-videos --seeds 0")
    rows = [{"command": ran, "date": "2026-01-01T00:00:00", "commit": "abcdef0123", "machine": {"cpu": "X", "cores": 2}}]
    text = pages.where_many(rows)
    assert "shared/data" not in text and "--families camera --source ~/videos/real --seeds 0" in text
    assert text.endswith("*`~/videos/real`: a folder of real videos of your own (at least two; these runs cut the "
                         "camera family from 19 clips of people, sport and street scenes).*")
    assert pages.shown("x --source data/shared/data/real-videos2") == "x --source data/shared/data/real-videos2"
    assert pages.where({"command": "b.py --src ../../shared/data/real-videos", "date": "2026-01-01"}).startswith(
        "*Measured by `b.py --src ~/videos/real` on ")
    assert "shared/data" in (RESULTS / "methods_ladder.jsonl").read_text()  # history, as it ran


def test_the_readmes_demo_table_is_the_seeds_record():
    """The README's demo figures are the record of the demo over three seeds (experiments/synth_evidence.py):
    each cell the seeds' mean ± sample std, so a user's own `make demo` can be read against a spread, not one run."""
    import statistics

    rec = json.loads((RESULTS / "synth_evidence.json").read_text())
    seeds = rec["figures"]["results"]["types"]
    readme = (ROOT / "README.md").read_text()
    head = next(line for line in readme.splitlines() if line.startswith("| network") and "seeds" in line)
    assert f"{len(rec['figures']['seeds'])} seeds" in head
    rows = {}
    for line in readme[readme.index(head):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    labels = {"random init": "random init", "simclr": "SimCLR base", "moquad": "MoQuad"}
    for method, label in labels.items():
        row = next(v for k, v in rows.items() if k.startswith(label))
        want = [f"{statistics.mean(100 * x for x in seeds[method][m]):.1f} ± "
                f"{statistics.stdev(100 * x for x in seeds[method][m]):.1f}"
                for m in ("hit@1", "knn_top1", "linear_top1")]
        assert row == want, (label, row, want)


def test_the_best_setting_is_the_highest_mean_over_families_once_every_seed_is_in(tmp_path, monkeypatch):
    pages = results_pages()
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    # (family, variant, seed, kNN, linear)
    runs = [("types", "random", 0, 0.2, 0.3), ("camera", "random", 0, 0.4, 0.3),
            ("types", "m", 0, 0.5, 0.7), ("camera", "m", 0, 0.3, 0.3),
            ("types", "m+slot=a", 0, 0.9, 0.9), ("camera", "m+slot=a", 0, 0.1, 0.1),
            ("types", "m", 1, 0.6, 0.5), ("camera", "m", 1, 0.5, 0.3)]
    lines = [{"family": f, "variant": v, "seed": s, "hit@1": 0.0, "knn_top1": k, "linear_top1": lin}
             for f, v, s, k, lin in runs]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["families=types,camera", "variants=m,m+slot=a"]
    table = pages.ladder_best("b.jsonl", args).splitlines()
    # random: kNN (20+40)/2 = 30, linear 30, score 30; m: types kNN 55 lin 60, camera kNN 40 lin 30 -> 47.5, 45, 46.25
    assert "| `random` | 2 | 30.0 | 30.0 | 30.0 |  |" in table
    assert "| `m` | 4 | 47.5 | 45.0 | 46.2 | +16.2 |" in table
    assert "| `m+slot=a` | 2 | 50.0 | 50.0 | 50.0 | +20.0 |" in table
    assert table[-1].startswith("Not chosen yet for `m`")  # m+slot=a lacks seed 1: nothing is chosen
    assert pages.best(lines, ["m", "m+slot=a"], ["types", "camera"]) is None
    lines += [{"family": f, "variant": "m+slot=a", "seed": 1, "hit@1": 0.0, "knn_top1": 0.2, "linear_top1": 0.2}
              for f in ("types", "camera")]  # now 35.0 over both seeds, below m's 46.2
    assert pages.best(lines, ["m", "m+slot=a"], ["types", "camera"]) == "m"
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert "| **`m`** (chosen) | 4 | 47.5 | 45.0 | 46.2 | +16.2 |" in pages.ladder_best("b.jsonl", args).splitlines()
