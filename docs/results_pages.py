"""mkdocs hook: the results tables, rendered at build time from the results records in ``docs/results/`` (what
``moquad/record.py`` writes, the ladder's JSON lines, the GPU campaign's records), so a page cannot drift from
the numbers. Each table comes with one line that says where and when it was measured and by which command.

Markers (each alone on a line of a page):

- ``<!-- moquad:table NAME KEY -->``: table KEY of ``docs/results/NAME.json``, with its notes.
- ``<!-- moquad:ladder FILE [families=a,b] [variants=x,y] -->``: the mean ± std over seeds of each family x
  variant of a ladder's JSON lines (``docs/results/FILE``; ``experiments/motion_ladder.py`` writes them).
- ``<!-- moquad:ladder-gain FILE BASE:VARIANT ... -->``: VARIANT minus BASE per family, paired by seed.
- ``<!-- moquad:ladder-best FILE families=a,b variants=x,y [base=random] -->``: each variant's kNN, linear and
  their mean over the families (each family the mean over its seeds), against BASE; per method (a variant's name
  before ``+``), the variant of highest mean once every variant has every seed (:func:`best`).
- ``<!-- moquad:gpu-campaign DIR -->``: the GPU campaign's records of ``docs/results/DIR/`` (CUDA runs only).

A marker whose record is not in the checkout renders as a note that names the command that writes it, so a page
can name results that another change brings; ``tests/test_records.py`` checks which records the pages expect.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MARK = re.compile(r"^<!-- moquad:(table|ladder|ladder-gain|ladder-best|gpu-campaign) (.+?) -->$", re.M)
MEASURES = (("hit@1", "hit@1"), ("knn_top1", "weighted kNN"), ("linear_top1", "linear"))
COMMANDS = {  # record -> the command that writes it, where it is not `python benchmarks/NAME.py`
    "motion_evidence": "python experiments/motion_evidence.py DIR ...",
    "motion_demo": "python experiments/motion_evidence.py runs/quickstart --variants random simclr moquad "
                   "--record docs/results/motion_demo.json",
    "encoder_motion": "OMP_NUM_THREADS=1 python experiments/encoder_motion.py --work runs/encoder_motion",
    "bench_preprocess_encoders": "python benchmarks/bench_preprocess.py --encoders --record "
                                 "docs/results/bench_preprocess_encoders.json",
}


class MissingRecord(Exception):
    """A page names a record that is not in docs/results/."""


# ----------------------------------------------------------------------------- where and when


def _machine(r: dict) -> str:
    m = r.get("machine") or {}
    d = r.get("device") or {}
    gpu = m.get("gpu") or (d.get("name") if d.get("kind") == "cuda" else None)
    cores = d.get("cpu_cores") or m.get("cores")
    cpu = m.get("cpu") or (d.get("name") if d and d.get("kind") != "cuda" else None)
    if gpu:
        return f"{gpu} ({cores} CPU cores)" if cores else gpu
    if cpu:
        return f"{cpu} ({cores} cores)" if cores else cpu
    return "a machine not recorded"


def _load(r: dict) -> str:
    start, end = r.get("load"), r.get("load_end")
    if not start:
        return ""
    text = f"load average {start[0]:.1f}"
    return text + (f" at the start, {end[0]:.1f} at the end" if end else "")


def _commit(r: dict) -> str:
    sha = r.get("commit")
    if not sha:
        return "commit not recorded"
    return f"commit {sha[:7]}" + (" with local changes" if r.get("dirty") else "")


def _lock(r: dict) -> str:
    """The lock the environment was installed from (records made before the project had a lock name none)."""
    lock = r.get("lock") or {}
    if not lock.get("sha256"):
        return "no lock recorded"
    return f"lock {lock['sha256'][:12]}" + ("" if lock.get("matches", True) else " (environment differed from it)")


# the real clips that the checkout's own runs cut the camera family from; a page shows a command with the folder of
# the reader's own real videos in their place (Getting started says where to get a few clips)
RUN_CLIPS = re.compile(r"(?<![\w/.~-])(?:\.\./)*shared/data/real-videos(?![\w/.-])")
OWN_CLIPS = "~/videos/real"
OWN_CLIPS_NOTE = (f"*`{OWN_CLIPS}`: a folder of real videos of your own (at least two; these runs cut the camera "
                  "family from 19 clips of people, sport and street scenes).*")


def shown(command: str) -> str:
    """A recorded command as a page shows it: the real clips it read are the reader's folder :data:`OWN_CLIPS`."""
    return RUN_CLIPS.sub(OWN_CLIPS, command)


def where(r: dict) -> str:
    """One line: the command, the machine, its load, the day, the commit and the lock of record ``r``."""
    parts = [_machine(r), _load(r), (r.get("date") or "date not recorded")[:10], _commit(r), _lock(r)]
    cmd = (f"`{shown(r['command'])}`" if r.get("command") else f"`{r['script']}` (its options not recorded)"
           if r.get("script") else "a command not recorded")
    return f"*Measured by {cmd} on " + ", ".join(p for p in parts if p) + ".*"


def where_many(rows: list[dict]) -> str:
    """The same for the lines of a JSONL: every command, machine, the range of days and the commits."""
    known = [r for r in rows if r.get("date")]
    if not known:
        return f"*{len(rows)} runs; where and when they ran is not recorded.*"
    days = sorted({r["date"][:10] for r in known})
    machines = list(dict.fromkeys(_machine(r) for r in known))
    commits = list(dict.fromkeys(_commit(r).removeprefix("commit ") for r in known))
    locks = list(dict.fromkeys(_lock(r) for r in known))
    commands = list(dict.fromkeys(r["command"] for r in known if r.get("command")))
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    text = (f"*{len(rows)} runs on {', '.join(machines)}, {when}, commit{'s' if len(commits) > 1 else ''} "
            f"{', '.join(commits)}, {', '.join(locks)}" + ("" if len(known) == len(rows) else f"; {len(rows) - len(known)} runs not "
                                       "recorded") + ".*")
    note = f"\n\n{OWN_CLIPS_NOTE}" if any(RUN_CLIPS.search(c) for c in commands) else ""
    return text + "".join(f"\n\n```bash\n{shown(c)}\n```" for c in commands) + note


# ----------------------------------------------------------------------------- tables


def md_table(columns: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(columns) - 1)
    cell = lambda c: "–" if c is None else str(c).replace("|", "\\|")  # noqa: E731
    return "\n".join(["| " + " | ".join(cell(c) for c in columns) + " |",
                      "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
                      *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)])


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise MissingRecord(f"No results are recorded in `docs/results/{name}.json` yet; "
                            f"`{COMMANDS.get(name, f'python benchmarks/{name}.py')}` records them")
    return json.loads(path.read_text())


def table(name: str, key: str) -> str:
    """Table KEY of record NAME: its title, the line that says where and when, the table, its notes."""
    r = load(name)
    if key not in r.get("tables", {}):
        raise MissingRecord(f"`docs/results/{name}.json` has no table {key!r} (it has {', '.join(r['tables'])}): "
                            f"`{r.get('command')}` did not measure it; the benchmark's options say which does")
    t = r["tables"][key]
    notes = "".join(f"\n\n{n}" for n in t.get("notes", []))
    title = f"{t['title'].rstrip('.')}.\n\n" if t.get("title") else ""
    return f"{title}{where(r)}\n\n{md_table(t['columns'], t['rows'], t.get('align'))}{notes}"


# ----------------------------------------------------------------------------- the ladder's JSON lines


def ladder_rows(file: str) -> list[dict]:
    path = RESULTS / file
    if not path.is_file():
        raise MissingRecord(f"No results are recorded in `docs/results/{file}` yet; `python "
                            "experiments/motion_ladder.py --out DIR ...` records them in `DIR/results.jsonl`")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _options(args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    option = lambda a: a.split("=", 1)[0] in OPTIONS  # noqa: E731  (a variant's name may hold "=")
    return [a for a in args if not option(a)], {k: v.split(",") for k, v in (a.split("=", 1) for a in args
                                                                             if option(a))}


OPTIONS = ("families", "variants", "base")  # a ladder marker's options (NAME=a,b); every other word is a pair or a name


def _mean_std(values: list[float]) -> str:
    """``mean ± std`` over seeds; one seed's value alone (no spread is measured)."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def ladder(file: str, args: list[str]) -> str:
    """Mean ± std over seeds (%) of each family x variant, in the order the marker names them (else the file's)."""
    rows = ladder_rows(file)
    _, opt = _options(args)
    families = opt.get("families") or list(dict.fromkeys(r["family"] for r in rows))
    variants = opt.get("variants") or list(dict.fromkeys(r["variant"] for r in rows))
    used = [r for r in rows if r["family"] in families and r["variant"] in variants]
    out = []
    for fam in families:
        for var in variants:
            rs = sorted((r for r in used if (r["family"], r["variant"]) == (fam, var)), key=lambda r: r["seed"])
            if rs:
                out.append([fam, f"`{var}`", len(rs), *(_mean_std([100 * r[m] for r in rs]) for m, _ in MEASURES)])
    if not out:
        raise MissingRecord(f"docs/results/{file} has no runs of {families} x {variants}")
    return f"{where_many(used)}\n\n" + md_table(["family", "variant", "seeds", *(t for _, t in MEASURES)], out,
                                                 "llrrrr")


def ladder_gain(file: str, args: list[str]) -> str:
    """Per family, VARIANT minus BASE (points) on the seeds both finished: mean ± std of the per-seed differences."""
    rows = ladder_rows(file)
    pairs, opt = _options(args)
    by = {(r["family"], r["variant"], r["seed"]): r for r in rows}
    families = opt.get("families") or list(dict.fromkeys(r["family"] for r in rows))
    out, used = [], []
    for pair in pairs:
        base, var = pair.split(":")
        for fam in families:
            seeds = sorted(s for (f, v, s) in by if (f, v) == (fam, var) and (fam, base, s) in by)
            if not seeds:
                continue
            used += [by[fam, v, s] for s in seeds for v in (base, var)]
            cells = []
            for m, _ in MEASURES:
                d = [100 * (by[fam, var, s][m] - by[fam, base, s][m]) for s in seeds]
                std = f" ± {statistics.stdev(d):.1f}" if len(d) > 1 else ""
                cells.append(f"{statistics.mean(d):+.1f}{std}")
            out.append([fam, f"`{var}` − `{base}`", len(seeds), *cells])
    if not out:
        raise MissingRecord(f"docs/results/{file} has no paired runs of {pairs}")
    used = list({(r["family"], r["variant"], r["seed"]): r for r in used}.values())  # a base shared by pairs: once
    return f"{where_many(used)}\n\n" + md_table(["family", "gain", "seeds", *(t for _, t in MEASURES)], out, "llrrrr")


SCORED = (("knn_top1", "weighted kNN"), ("linear_top1", "linear"))  # what a default is chosen by: their mean


def scores(rows: list[dict], variant: str, families: list[str]) -> dict[str, Any]:
    """A variant's runs, its seeds per family, and its kNN, linear and score (their mean) in %: the mean over the
    families of each family's mean over its seeds (None where a family has no run)."""
    per = {f: [r for r in rows if (r["family"], r["variant"]) == (f, variant)] for f in families}
    out: dict[str, Any] = {"runs": sum(map(len, per.values())), "seeds": {f: sorted(r["seed"] for r in rs)
                                                                          for f, rs in per.items()}}
    for m, _ in SCORED:
        out[m] = (statistics.mean(statistics.mean(100 * r[m] for r in rs) for rs in per.values())
                  if all(per.values()) else None)
    out["score"] = None if out["knn_top1"] is None else (out["knn_top1"] + out["linear_top1"]) / 2
    return out


def best(rows: list[dict], variants: list[str], families: list[str]) -> str | None:
    """The variant of highest score among ``variants``, once each has the same seeds on every family as the
    variant with the most runs (None before: an incomplete comparison chooses nothing)."""
    s = {v: scores(rows, v, families) for v in variants}
    full = max(s.values(), key=lambda x: x["runs"])["seeds"]
    if any(x["seeds"] != full for x in s.values()) or not all(full.values()):
        return None
    return max(variants, key=lambda v: s[v]["score"])


def ladder_best(file: str, args: list[str]) -> str:
    """Each variant's kNN, linear and score over the families against BASE (points), and each method's choice."""
    rows = ladder_rows(file)
    _, opt = _options(args)
    families, variants, base = opt["families"], opt["variants"], opt.get("base", ["random"])[0]
    b = scores(rows, base, families)
    f1 = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    gain = lambda v: "–" if v is None or b["score"] is None else f"{v - b['score']:+.1f}"  # noqa: E731
    methods = list(dict.fromkeys(v.split("+")[0] for v in variants))
    chosen = {m: best(rows, [v for v in variants if v.split("+")[0] == m], families) for m in methods}
    out = [[f"`{base}`", b["runs"], f1(b["knn_top1"]), f1(b["linear_top1"]), f1(b["score"]), ""]]
    for v in variants:
        s = scores(rows, v, families)
        name = f"**`{v}`** (chosen)" if v in chosen.values() else f"`{v}`"
        out.append([name, s["runs"], f1(s["knn_top1"]), f1(s["linear_top1"]), f1(s["score"]), gain(s["score"])])
    used = [r for r in rows if r["family"] in families and r["variant"] in [base, *variants]]
    open_ = [m for m in methods if chosen[m] is None]
    note = (f"\n\nNot chosen yet for {', '.join(f'`{m}`' for m in open_)}: a choice waits until every setting has "
            "every seed on every family." if open_ else "")
    return (f"{where_many(used)}\n\n" + md_table(["setting", "runs", *(t for _, t in SCORED), "score",
                                                   f"score − `{base}`"], out, "lrrrrr") + note)


# ----------------------------------------------------------------------------- the GPU campaign


def _f(v: Any, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and v == v else "–"


def _paths(r: dict) -> list[str]:
    f, out = r["figures"], []
    if "pytest -m gpu" in f:
        p = f["pytest -m gpu"]
        failed = f"; failed: {', '.join(p['failures'])}" if p.get("failures") else ""
        out += [f"`pytest -m gpu`: {p.get('passed', 0)} passed, {p.get('failed', 0)} failed, {p.get('skipped', 0)} "
                f"skipped in {_f(p['seconds'], '.0f')} s{failed}.", ""]
    if "steps" in f:
        rows = [[s["backbone"], f"{s['frames']}x{s['size']}²", s["batch"], _f(s.get("simclr_ms_per_video")),
                 _f(s.get("moquad_ms_per_video")), _f(s.get("ratio")),
                 f"{_f(s.get('simclr_peak_mib'), '.0f')} / {_f(s.get('moquad_peak_mib'), '.0f')}"] for s in f["steps"]]
        out += [md_table(["backbone", "clip", "batch", "SimCLR ms/video", "MoQuad ms/video", "ratio", "peak MiB"],
                         rows, "llrrrrr"), ""]
    if "preempt + resume" in f:
        p = f["preempt + resume"]
        out += [f"Preemption under torchrun: {p['ranks']} rank(s), {p['backend']}; SIGUSR1 -> exit "
                f"{p['exit_code_on_signal']} in {_f(p['seconds_signal_to_exit'])} s, checkpoint at step "
                f"{p['checkpoint_step']}; `--resume` continued at step {p['resumed_first_step']} and ended at "
                f"{p['final_step']} of {p['expected_steps']}.", ""]
    if "eval commands" in f:
        rows = []
        for e in f["eval commands"]:
            res = ", ".join(f"{k} {_f(e[k], '.3f')}" for k in ("top1", "top5", "knn_top1") if k in e)
            rows.append([f"`{e['name']}`", e["exit_code"], _f(e["seconds"], ".1f"), res or e.get("error", "")[:60]])
        out += [md_table(["command", "exit", "seconds", "result"], rows, "lrrl"), ""]
    return out


def _decode(r: dict) -> list[str]:
    f = r["figures"]
    rows = [[name[4:], e.get("cpu_cores_allowed", "–"), _f(e.get("clips_per_s"), ".0f"), _f(e.get("of_gpu_bound")),
             _f(e.get("data_wait"), ".3f"), _f(e.get("gpu_busy"), ".0f")] if "clips_per_s" in e else
            [name[4:], f"failed: {e.get('error', '')[:60]}", "", "", "", ""]
            for name, e in f.items() if name.startswith("e2e") and isinstance(e, dict)]
    bound = f.get("gpu-bound", {}).get("clips_per_s")
    return [f"The GPU-bound rate (a synthetic batch already on the device) is {_f(bound, '.0f')} clips/s.", "",
            md_table(["data path, workers", "CPU cores", "clips/s", "of GPU-bound", "data wait", "GPU busy %"], rows), ""]


def _ladder_gpu(records: list[dict]) -> list[str]:
    rows = []
    for r in records:
        f = r["figures"]
        d, p, e = f.get("data", {}), f.get("pretrain", {}), f.get("eval", {})
        rows.append([d.get("family", "–"), d.get("seed", "–"), r["job"].rsplit("-", 1)[1], p.get("steps", "–"),
                     _f(p.get("clips_per_s"), ".0f"), _f(e.get("hit@1"), ".3f"), _f(e.get("knn_top1"), ".3f"),
                     _f(e.get("linear_top1"), ".3f"), r["status"]])
    return [md_table(["family", "seed", "method", "steps", "clips/s", "hit@1", "weighted kNN", "linear", "status"],
                     rows, "lrlrrrrrl"), ""]


def gpu_campaign(folder: str) -> str:
    """Every CUDA record of the campaign folder: the paths, decode and ladder jobs, each with where and when."""
    records = [json.loads(p.read_text()) for p in sorted((RESULTS / folder).glob("*.json"))]  # folder: may be absolute
    records = [r for r in records if "job" in r and r.get("device", {}).get("kind") == "cuda"]
    if not records:
        return "No campaign job has a GPU record yet."
    out = []
    for r in records:
        if r["job"] in ("paths", "decode"):
            out += [f"### {r['job']}", "", where(r) + (f" Status: {r['status']}." if r["status"] != "done" else ""), ""]
            out += _paths(r) if r["job"] == "paths" else _decode(r)
    ladder_records = [r for r in records if r["job"].startswith("ladder-")]
    if ladder_records:
        out += ["### ladder", "", where_many(ladder_records), "", *_ladder_gpu(ladder_records)]
    return "\n".join(out).rstrip()


# ----------------------------------------------------------------------------- the hook


RENDER = {"table": lambda a: table(*a), "ladder": lambda a: ladder(a[0], a[1:]),
          "ladder-gain": lambda a: ladder_gain(a[0], a[1:]), "ladder-best": lambda a: ladder_best(a[0], a[1:]),
          "gpu-campaign": lambda a: gpu_campaign(a[0])}


def _one(m: re.Match) -> str:
    try:
        return RENDER[m.group(1)](m.group(2).split())
    except MissingRecord as e:
        return f'!!! warning "Not measured yet"\n    {e}.'


def render(markdown: str) -> str:
    """Every marker of a page replaced by its rendered table (or the note that says how to measure it)."""
    return MARK.sub(_one, markdown)


def markers(markdown: str) -> list[tuple[str, list[str]]]:
    """The markers of a page: (kind, arguments)."""
    return [(m.group(1), m.group(2).split()) for m in MARK.finditer(markdown)]


def on_page_markdown(markdown: str, page, config, files) -> str:
    return render(markdown)
