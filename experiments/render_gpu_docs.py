"""Render docs/gpu.md from the GPU campaign's JSONs (docs/gpu/*.json) and the earlier runs' (docs/bench_gpu_*.json).

    python experiments/render_gpu_docs.py            # writes docs/gpu.md
    python experiments/render_gpu_docs.py --stdout   # prints it

Every table names the device and the date of its run; only CUDA runs are rendered (``--include-cpu`` adds the
CPU dry runs, for the test). The jobs of the campaign with no CUDA run yet are listed, so the page says what
remains. How to run a slot: docs/gpu-campaign.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EARLIER = ("bench_gpu_h200.json", "bench_gpu_h100.json")


def _f(v, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and v == v else "–"


def _where(r: dict) -> str:
    d = r["device"]
    return (f"{d.get('name')} (driver {d.get('driver') or '–'}, torch {d.get('torch')}, CUDA {d.get('cuda') or '–'}, "
            f"{d.get('cpu_cores')} CPU cores), {r['date']}, commit {(r.get('commit') or '–')[:10]}, "
            f"code {r['code_hash']}, {r['status']}" + (f": {r['message']}" if r.get("message") else ""))


def paths_md(r: dict) -> list[str]:
    f = r["figures"]
    out = [f"### paths: {_where(r)}", ""]
    if "pytest -m gpu" in f:
        p = f["pytest -m gpu"]
        out += [f"`pytest -m gpu`: {p.get('passed', 0)} passed, {p.get('failed', 0)} failed, {p.get('skipped', 0)} "
                f"skipped in {_f(p['seconds'], '.0f')} s" + (f"; failed: {', '.join(p['failures'])}"
                                                              if p.get("failures") else ""), ""]
    if "steps" in f:
        out += ["| backbone | clip | batch | SimCLR base ms/video | MoQuad ms/video | MoQuad / base | peak MiB "
                "(base / MoQuad) |", "|---|---|---:|---:|---:|---:|---|"]
        for s in f["steps"]:
            err = s.get("moquad_error") or s.get("simclr_error")
            out.append(f"| {s['backbone']} | {s['frames']}x{s['size']}² | {s['batch']} | "
                       f"{_f(s.get('simclr_ms_per_video'))} | {_f(s.get('moquad_ms_per_video'))} | "
                       f"{_f(s.get('ratio'))} | {_f(s.get('simclr_peak_mib'), '.0f')} / "
                       f"{_f(s.get('moquad_peak_mib'), '.0f')}" + (f" ({err[:80]})" if err else "") + " |")
        out.append("")
    if "preempt + resume" in f:
        p = f["preempt + resume"]
        out += [f"Preemption under torchrun: {p['ranks']} rank(s), {p['backend']}; SIGUSR1 to {p['ranks_signalled']} "
                f"rank(s) -> exit {p['exit_code_on_signal']} in {_f(p['seconds_signal_to_exit'])} s, checkpoint at "
                f"step {p['checkpoint_step']}; `--resume` (exit {p['resume_exit_code']}) continued at step "
                f"{p['resumed_first_step']} and ended at {p['final_step']} of {p['expected_steps']}. {p['note']}.", ""]
    if "eval commands" in f:
        out += ["| command | exit | seconds | result |", "|---|---:|---:|---|"]
        for e in f["eval commands"]:
            res = ", ".join(f"{k} {_f(e[k], '.3f')}" for k in ("top1", "top5", "knn_top1") if k in e) or \
                e.get("error", "")[:100]
            out.append(f"| `{e['name']}` | {e['exit_code']} | {_f(e['seconds'], '.1f')} | {res} |")
        out.append("")
    return out


def decode_md(r: dict) -> list[str]:
    f = r["figures"]
    bound = f.get("gpu-bound", {}).get("clips_per_s")
    out = [f"### decode: {_where(r)}", "", f"GPU-bound rate (synthetic batch on the device): {_f(bound, '.0f')} clips/s",
           "", "| `moquad pretrain`, data path x workers | CPU cores | clips/s | of GPU-bound | data wait | GPU busy % |",
           "|---|---:|---:|---:|---:|---:|"]
    for name, e in f.items():
        if name.startswith("e2e") and isinstance(e, dict):
            out.append(f"| {name[4:]} | {e.get('cpu_cores_allowed', '–')} | {_f(e.get('clips_per_s'), '.0f')} | "
                       f"{_f(e.get('of_gpu_bound'))} | {_f(e.get('data_wait'), '.3f')} | {_f(e.get('gpu_busy'), '.0f')} |"
                       if "clips_per_s" in e else f"| {name[4:]} | failed: {e.get('error', '')[:80]} | | | | |")
    return out + [""]


def ladder_md(records: list[dict]) -> list[str]:
    out = ["### ladder", "", "| family | seed | method | steps | clips/s | hit@1 | weighted kNN | linear | data "
           "(videos, train sha) | device, date | status |", "|---|---:|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in records:
        f = r["figures"]
        d, p, e = f.get("data", {}), f.get("pretrain", {}), f.get("eval", {})
        out.append(f"| {d.get('family', '–')} | {d.get('seed', '–')} | {r['job'].rsplit('-', 1)[1]} | "
                   f"{p.get('steps', '–')} | {_f(p.get('clips_per_s'), '.0f')} | {_f(e.get('hit@1'), '.3f')} | "
                   f"{_f(e.get('knn_top1'), '.3f')} | {_f(e.get('linear_top1'), '.3f')} | {d.get('videos', '–')}, "
                   f"{d.get('train_manifest_sha256', '–')} | {r['device'].get('name')}, {r['date'][:10]} | "
                   f"{r['status']} |")
    return out + [""]


def earlier_md(path: Path) -> list[str]:
    from bench_gpu import print_tables

    r = json.loads(path.read_text())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_tables(r)
    return [f"### {path.name}: {r['device']}, torch {r['torch']}, {r.get('date', 'date not recorded')} "
            "(`experiments/bench_gpu.py`)", "", *buf.getvalue().strip().splitlines()[1:], ""]


def render(folder: Path, earlier: list[Path], include_cpu: bool = False) -> str:
    """The page: campaign results per job kind, what is not yet run on a GPU, then the earlier runs."""
    from gpu_campaign import expand

    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    records = [r for r in records if "job" in r and (include_cpu or r["device"].get("kind") == "cuda")]
    out = ["# GPU results", "", "Rendered by `python experiments/render_gpu_docs.py` from `docs/gpu/*.json` (the GPU "
           "campaign, `experiments/gpu_campaign.py`; how to run a slot: [gpu-campaign.md](gpu-campaign.md)) and the "
           "earlier `docs/bench_gpu_*.json`. Do not edit by hand.", "", "## Campaign", ""]
    ran = {r["job"] for r in records if r["device"].get("kind") == "cuda" and r["status"] == "done"}
    todo = [j for j in expand(["paths", "decode", "ladder"]) if j not in ran]
    out += [f"Campaign jobs not yet run on a GPU: {', '.join(todo) if todo else 'none'}.", ""]
    for r in records:
        if r["job"] == "paths":
            out += paths_md(r)
        elif r["job"] == "decode":
            out += decode_md(r)
    ladder = [r for r in records if r["job"].startswith("ladder-")]
    if ladder:
        out += ladder_md(ladder)
    if not records:
        out += ["No campaign job has run on a GPU yet.", ""]
    out += ["## Earlier runs", ""]
    for p in earlier:
        if p.is_file():
            out += earlier_md(p)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=str(ROOT / "docs" / "gpu"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "gpu.md"))
    ap.add_argument("--include-cpu", action="store_true", help="also the CPU dry runs")
    ap.add_argument("--stdout", action="store_true")
    args = ap.parse_args()
    text = render(Path(args.folder), [ROOT / "docs" / n for n in EARLIER], args.include_cpu)
    if args.stdout:
        print(text, end="")
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
