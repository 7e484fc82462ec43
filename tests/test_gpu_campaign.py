"""The GPU campaign's CPU dry run (experiments/gpu_campaign.py --device cpu --tiny): every job at toy size, the
JSON records' schema and values, the budget cut-off, the rule that skips jobs done for this code, and the tables the
docs render from the records (docs/results_pages.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~20 subprocesses (each CLI command end to end); its cost: the GPU campaign page
ROOT = Path(__file__).resolve().parents[1]
# the dry run's jobs: every job kind, and two methods of one ladder family and seed (the base's job is the same code)
DRY_JOBS = ["paths", "decode", "ladder-directions-s0-random", "ladder-directions-s0-moquad"]
CAMPAIGN = ROOT / "experiments" / "gpu_campaign.py"  # imported by name: experiments/ is on pytest's pythonpath


def campaign(out: Path, work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CAMPAIGN), "--device", "cpu", "--tiny", "--out", str(out), "--work",
                           str(work), *extra], capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("campaign")
    proc = campaign(base / "out", base / "work", "--budget-s", "900", "--jobs", ",".join(DRY_JOBS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return base / "out", proc


def records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def test_every_job_writes_one_complete_record(dry_run):
    import gpu_campaign

    out, proc = dry_run
    recs = records(out)
    assert set(recs) == set(DRY_JOBS) and set(DRY_JOBS) < set(gpu_campaign.expand(["paths", "decode", "ladder"]))
    assert all(f"campaign: {j} done" in proc.stdout for j in DRY_JOBS)  # progress lines
    for name, r in recs.items():
        assert r["job"] == name and r["status"] == "done" and r["tiny"] is True and r["errors"] == {}, (name, r)
        assert r["code_hash"] == gpu_campaign.code_hash() and len(r["code_hash"]) == 12
        assert r["device"]["kind"] == "cpu" and r["device"]["torch"] and r["date"][:2] == "20"
        assert "--tiny" in r["command"] and r["missing_modules"] == []
        assert all(s >= 0 for s in r["step_seconds"].values()) and r["seconds"] > 0


def test_paths_figures(dry_run):
    from moquad.models.backbones import BACKBONES

    f = records(dry_run[0])["paths"]["figures"]
    assert f["pytest -m gpu"]["exit_code"] == 0 and f["pytest -m gpu"]["skipped"] >= 10  # no CUDA: all skipped
    assert [s["backbone"] for s in f["steps"]] == list(BACKBONES)  # every row of the table, read at run time
    for s in f["steps"]:
        assert s["simclr_ms_per_video"] > 0 and s["moquad_ms_per_video"] > 0, s
        assert s["ratio"] == pytest.approx(s["moquad_ms_per_video"] / s["simclr_ms_per_video"])
    p = f["preempt + resume"]
    assert (p["ranks"], p["backend"], p["ranks_signalled"]) == (2, "gloo", 2)
    assert p["preempted_line"].startswith("preempted: SIGUSR1 received")
    assert 1 <= p["checkpoint_step"] < p["expected_steps"]
    assert p["resumed_first_step"] == p["checkpoint_step"] + 1  # the resume continues at the step after the stop
    assert p["final_step"] == p["expected_steps"] and p["resume_exit_code"] == 0
    evals = {e["name"]: e for e in f["eval commands"]}
    assert list(evals) == ["extract", "retrieve", "linear --fast", "finetune 1 epoch", "cam", "motion"]
    assert all(e["exit_code"] == 0 and e["seconds"] > 0 for e in evals.values()), evals
    for name, key in (("retrieve", "knn_top1"), ("linear --fast", "top1"), ("finetune 1 epoch", "top1")):
        assert 0.0 <= evals[name][key] <= 1.0


def test_decode_and_ladder_figures(dry_run):
    recs = records(dry_run[0])
    d = recs["decode"]["figures"]
    assert d["gpu-bound"]["clips_per_s"] > 0 and d["gpu-bound"]["ms_per_step"] > 0
    for name in ("e2e workers x1", "e2e device x1"):
        assert d[name]["clips_per_s"] > 0 and 0 <= d[name]["data_wait"] <= 1 and d[name]["of_gpu_bound"] > 0
    shas = set()
    for name, r in recs.items():
        if not name.startswith("ladder-"):
            continue
        f = r["figures"]
        assert f["data"]["videos"] == f["data"]["train"] + f["data"]["test"] == 32
        shas.add(f["data"]["train_manifest_sha256"])
        for k in ("hit@1", "knn_top1", "linear_top1"):
            assert 0.0 <= f["eval"][k] <= 1.0
        if not name.endswith("-random"):
            p = f["pretrain"]
            assert p["steps"] == p["planned_steps"] >= 6 and p["clips_per_s"] > 0 and p["exit_code"] == 0
    assert len(shas) == 1  # every method of a family and seed saw the same videos


def test_a_second_run_skips_the_jobs_done_for_this_code(dry_run, tmp_path):
    """Without --jobs: the jobs done for this code are skipped; the one left (the base's ladder job) does not fit
    a 3 s budget, so it is skipped with a message and nothing is written."""
    out, _ = dry_run
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    proc = campaign(out, tmp_path / "work", "--budget-s", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped ladder-directions-s0-simclr: needs ~5 s" in proc.stdout
    assert not any(f"[{j}]" in proc.stdout or f"skipped {j}:" in proc.stdout for j in DRY_JOBS), proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")} == before


def test_a_tiny_budget_writes_a_partial_record_and_exits_0(tmp_path):
    """The job starts (its 10 s estimate fits a 120 s budget after any start-up) but its first step's estimate,
    scaled 1000x, does not: the run stops at the budget, writes a partial record with nothing faked, exits 0.
    Deterministic whatever the load (a real cut mid-step depended on how fast the box was)."""
    proc = campaign(tmp_path / "out", tmp_path / "work", "--budget-s", "120", "--jobs", "paths",
                    "--step-estimate-scale", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "stopped at the budget" in proc.stdout
    r = json.loads((tmp_path / "out" / "paths.json").read_text())
    assert r["status"] == "partial" and "budget ran out" in r["message"]
    assert "eval commands" not in r["figures"]  # what was not reached is absent, not faked


def test_collect_copies_records_and_refuses_an_empty_folder(tmp_path, monkeypatch):
    import gpu_campaign

    monkeypatch.setattr(gpu_campaign, "DOCS", tmp_path / "docs")
    (tmp_path / "got").mkdir()
    assert gpu_campaign.collect(str(tmp_path / "got")) == 2
    (tmp_path / "got" / "paths.json").write_text('{"job": "paths"}')
    assert gpu_campaign.collect(str(tmp_path / "got")) == 0
    assert json.loads((tmp_path / "docs" / "paths.json").read_text()) == {"job": "paths"}


def results_pages():
    """docs/results_pages.py, the docs' renderer of results records (a file of the docs folder, loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "docs" / "results_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_render_the_gpu_records(dry_run, tmp_path):
    pages = results_pages()
    out, _ = dry_run
    assert pages.gpu_campaign(str(out)) == "No campaign job has a GPU record yet."  # CPU dry runs are no GPU results
    # the same records as if from a GPU: each job's tables, with where and when
    for p in out.glob("*.json"):
        r = json.loads(p.read_text())
        r["device"].update(kind="cuda", name="NVIDIA H200", driver="580.159.04", cpu_cores=16)
        (tmp_path / p.name).write_text(json.dumps(r))
    page = pages.gpu_campaign(str(tmp_path))
    steps = records(out)["paths"]["figures"]["steps"][0]
    assert f"| {steps['backbone']} | 8x32² | 2 | {steps['simclr_ms_per_video']:.2f} |" in page
    knn = records(out)["ladder-directions-s0-moquad"]["figures"]["eval"]["knn_top1"]
    assert "| directions | 0 | moquad |" in page and f"{knn:.3f}" in page
    assert "### decode\n\n*Measured by `python experiments/gpu_campaign.py --device cpu --tiny" in page
    assert "on NVIDIA H200 (16 CPU cores)" in page
