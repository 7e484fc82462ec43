"""The GPU campaign: every GPU path and a GPU-scale ladder, in jobs that each fit a short GPU allocation (a SLURM job
with a time limit, a spot instance), so that a few such allocations in a row measure everything (docs: "Running
the GPU campaign"; the results page renders the records).

    python experiments/gpu_campaign.py --budget-s 540 [--jobs paths,decode,ladder] [--device cuda|cpu] [--tiny]
                                      [--out docs/results/gpu]
    python experiments/gpu_campaign.py --collect DIR      # copy the JSONs an allocation wrote into docs/results/gpu/

Each job writes ONE JSON ``OUT/<job>.json``: the device (name, driver, memory, torch / CUDA versions, cores), the
git commit (or ``$MOQUAD_COMMIT`` where the copy of the code has no ``.git``), the hash of the code (``moquad/`` and
the two benchmark scripts), the command, the machine and its load, the date, every figure, the seconds of each step
and ``status`` (``done``, or ``partial`` when the budget ran out: the figures finished so far, and what is left).
Before each step the remaining budget is checked against the step's estimate; a job that cannot fit is not started.
Without ``--jobs`` it runs the jobs not yet done for this code (a ``done`` JSON with this code hash, device kind and
size in OUT or docs/results/gpu/); named jobs always run, so a preempted or timed-out allocation loses at most the
job it was in.

Jobs (``JOBS``; sizes in ``SIZES``, ``--tiny``: toy sizes for the CPU dry run of tests/test_gpu_campaign.py):

- ``paths``: ``pytest -m gpu``; a training step of every row of the backbone table (read at run time), the SimCLR
  base (2 views) and MoQuad (4), bf16, 16x112 and 16x224: ms per video and peak memory; ``moquad pretrain`` under
  torchrun (NCCL, one rank per GPU: NCCL refuses two ranks on one GPU) stopped by SIGUSR1 and resumed; the
  evaluation commands end to end on its checkpoint (extract, retrieve, linear --fast, finetune 1 epoch, cam, motion).
- ``decode``: ``moquad pretrain`` on 2 CPU cores (taskset) in each data path against the GPU-bound rate
  (the same step on a synthetic batch already on the device).
- ``ladder-<family>-s<seed>-<method>``: a synthetic family (experiments/motion_ladder.py's FAMILIES) of 2,000
  videos at 128 px rendered on the machine's cores, R3D-18 pre-trained at 16x112, batch 64, 1,000 steps with the
  CPU demo's recipe (train/cpu_demo.yaml; lr 3.2 at batch 256 and the paper's head), then weighted kNN and the
  fast linear probe. ``random`` is the untrained network. One method per job: on an H100 MoQuad alone is ~330 s
  of steps (5.06 ms/video), the base ~170 s, so base and MoQuad together (~500 s of steps, plus rendering and
  evaluation) do not fit a 540 s budget with margin; each job renders the same videos again (deterministic).
  ``--jobs ladder``: random, simclr, moquad (and moco, moco_moquad when the METHODS table has them) on
  directions, seed 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # this folder: the GPU benchmark and the ladder, imported by name
ROOT = HERE.parent
DOCS = ROOT / "docs" / "results" / "gpu"
# import name -> the wheel a bare GPU image (Python 3.12 and torch only) lacks; pylance 0.20 because its wheel is
# 33 MB where 14.x's is 85 MB, for a machine that receives the wheels with the code; 0.20 lacks only the IVF_FLAT
# ANN index, which the campaign does not use
WHEELS = {"simplejpeg": "simplejpeg==1.9.0", "ffmpeg": "ffmpeg-python==0.2.0", "future": "future==1.0.0",
          "webdataset": "webdataset==1.0.2", "braceexpand": "braceexpand==0.1.7", "lance": "pylance==0.20.0"}
DOWNLOAD = ("python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            "--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "
            "-d .whl " + " ".join(WHEELS.values()))
SITE = "/tmp/site"
INSTALL = f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target {SITE} " \
          ".whl/*.whl"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size of the campaign: the GPU's, or the CPU dry run's (``--tiny``)."""

    step_clips: tuple = ((112, 32), (224, 16))  # (crop, batch) of the step table
    frames: int = 16
    timed_steps: int = 10
    warmup_steps: int = 3
    data: tuple = (4, 12, 128, 64)  # paths/decode data: classes, per class, px, frames
    decode_videos: int = 640
    run_backbone: str = "r3d_18"
    run_batch: int = 8  # preemption run (global batch)
    run_epochs: int = 3
    decode_batch: int = 32
    decode_epochs: int = 3
    workers: int = 8
    ladder_videos: int = 2000  # 4 classes
    ladder_px: tuple = (128, 64)  # rendered side, frames
    ladder_batch: int = 64
    ladder_steps: int = 1000
    ladder_workers: int = 14
    eval_clips: int = 5
    estimates: tuple = (("paths", 360), ("decode", 150), ("random", 90), ("simclr", 300), ("moquad", 450))


SIZES = {"gpu": Sizes(),
         "tiny": Sizes(step_clips=((32, 2),), frames=8, timed_steps=1, warmup_steps=0, data=(4, 4, 48, 24), decode_videos=16,
                       run_backbone="tiny", run_batch=4, run_epochs=3, decode_batch=4, decode_epochs=2, workers=0,
                       ladder_videos=32, ladder_px=(48, 24), ladder_batch=8, ladder_steps=6, ladder_workers=0,
                       eval_clips=2, estimates=(("paths", 10), ("decode", 5), ("random", 3), ("simclr", 5),
                                                ("moquad", 5)))}


class OutOfTime(Exception):
    """The budget left is smaller than the next step's estimate."""


# ---------------------------------------------------------------- the environment


def ensure_wheels() -> list[str]:
    """Install the wheels of ``.whl/`` into SITE when a module of WHEELS is missing (the bare GPU machine), then run
    again with SITE on the path; returns the modules still missing (each one line of the record)."""
    missing = [m for m in WHEELS if importlib.util.find_spec(m) is None]
    if missing and list((ROOT / ".whl").glob("*.whl")) and not Path(SITE).is_dir():
        print(f"installing wheels for {', '.join(missing)}: {INSTALL}", flush=True)
        subprocess.run(INSTALL.replace("python3", shlex.quote(sys.executable), 1), shell=True, cwd=ROOT, check=False)
        reexec_on_path()
    if missing:
        print(f"warning: missing {', '.join(missing)}; on a machine without them run here: {DOWNLOAD}, and carry .whl",
              flush=True)
    return missing


def child_env() -> dict[str, str]:
    """The environment of every subprocess and of the campaign itself: SITE and this checkout first on the path
    (the bare GPU machine has no moquad installed; elsewhere this checkout wins), output unbuffered."""
    path = [SITE] if Path(SITE).is_dir() else []
    path += [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    path = list(dict.fromkeys(p for p in path if p))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}


def reexec_on_path() -> None:
    """Run this command again under :func:`child_env` unless it already runs there: imports resolve by the
    environment, the same in the campaign and in its subprocesses, and nothing edits ``sys.path``."""
    env = child_env()
    if os.environ.get("PYTHONPATH") != env["PYTHONPATH"]:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def code_hash() -> str:
    """sha256 (12 hex) of the code a result depends on: moquad/ (sources and recipes) and the campaign scripts."""
    h = hashlib.sha256()
    files = sorted(p for p in (ROOT / "moquad").rglob("*") if p.suffix in (".py", ".yaml") and p.is_file())
    for p in [*files, HERE / "bench_gpu.py", Path(__file__).resolve()]:
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def device_info(device: str) -> dict:
    import torch

    info = {"kind": device, "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(),
            "python": platform.python_version()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, gpus=torch.cuda.device_count(), memory_mib=props.total_memory // 2**20,
                    cudnn=torch.backends.cudnn.version())
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            info["driver"] = None
    else:
        info.update(name=platform.processor() or platform.machine(), gpus=0, driver=None)
    return info


# ---------------------------------------------------------------- jobs: bookkeeping


class Job:
    """One job's run: its figures, the seconds of each step, the errors, and the budget check before each step."""

    def __init__(self, name: str, args: argparse.Namespace, deadline: float) -> None:
        self.name, self.args, self.deadline = name, args, deadline
        self.sizes = SIZES["tiny" if args.tiny else "gpu"]
        self.figures: dict = {}
        self.seconds: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.work = Path(args.work) / name
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def need(self, what: str, seconds: float) -> None:
        seconds *= self.args.step_estimate_scale
        if self.left() < seconds:
            raise OutOfTime(f"{what} needs ~{seconds:.0f} s, {max(0.0, self.left()):.0f} s of the budget left")

    def step(self, name: str, gpu_s: float, fn, *a, **kw):
        """Run ``fn`` as step ``name`` (estimate ``gpu_s`` on the GPU, a tenth in --tiny); its result is a figure,
        an exception a line in ``errors`` (the job goes on), running out of budget ends the job."""
        self.need(name, gpu_s / 10 if self.args.tiny else gpu_s)
        print(f"[{self.name}] {name} (~{gpu_s:.0f} s on a GPU; {self.left():.0f} s left)", flush=True)
        t0 = time.time()
        try:
            result = fn(*a, **kw)
        except OutOfTime:
            raise
        except Exception as e:  # a failed path is a result too: recorded, and the next step runs
            self.errors[name] = f"{type(e).__name__}: {e}"[-2000:]
            print(f"[{self.name}] {name} failed: {self.errors[name]}", flush=True)
            result = None
        self.seconds[name] = round(time.time() - t0, 2)
        if result is not None:
            self.figures[name] = result
        return result


def run_cmd(cmd: list[str], job: Job, *, log: Path, margin: float = 5.0, cap: float = 600.0,
            keep_stopped: bool = False) -> tuple[int, float]:
    """A subprocess with output to ``log``, stopped when the budget (less ``margin``) runs out: SIGUSR1 first (a
    pretrain checkpoints and exits 75), SIGKILL 40 s later; then OutOfTime, unless ``keep_stopped`` (the caller
    uses what the stopped command left). Returns (exit code, seconds)."""
    limit = min(cap, job.left() - margin)
    if limit <= 0:
        raise OutOfTime(f"{' '.join(cmd[:4])}: no budget left")
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)
            try:
                rc = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            f.write(f"\n[campaign] stopped at the budget ({limit:.0f} s)\n")
            if not keep_stopped:
                raise OutOfTime(f"{' '.join(map(str, cmd[1:5]))} stopped at the budget after {limit:.0f} s") from None
    return rc, time.time() - t0


def tail(log: Path, lines: int = 3) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:]) if log.is_file() else ""


def moquad_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "moquad.cli", *map(str, args)]


# ---------------------------------------------------------------- data


def render(out: Path, family: str, seed: int, videos: int, px: int, frames: int, procs: int) -> dict:
    """A synthetic family (motion_ladder.FAMILIES) of ``videos`` videos (4 classes) written as train / test shards,
    rendered in chunks over ``procs`` processes (bench_gpu._render_chunk); the figures of the data."""
    from multiprocessing import get_context

    from bench_gpu import _render_chunk
    from motion_ladder import FAMILIES

    from moquad.preprocess.frames import write_frames
    from moquad.synth import DIRECTIONS, MOTIONS

    kind, extra = FAMILIES[family]
    if kind == "camera":
        raise ValueError("the camera family needs real footage; choose types, directions, directions-still or -slow")
    per_chunk = 4 if videos <= 64 else 10  # per class: 20% of a chunk's groups are test groups (synth._test_groups)
    chunks = [(c, per_chunk, px, frames, kind, 4, seed, extra) for c in range(max(1, videos // (4 * per_chunk)))]
    t0 = time.time()
    with get_context("fork").Pool(max(1, procs)) as pool:
        rendered = [v for chunk in pool.map(_render_chunk, chunks) for v in chunk]
    names = list((MOTIONS if kind == "types" else DIRECTIONS)[:4])
    for split, test in (("train", False), ("test", True)):
        write_frames(out, ((v, j, lab) for v, j, lab, t in rendered if t == test), split=split, classes=names,
                     videos_per_shard=256)
    manifest = hashlib.sha256((out / "manifests" / "train.parquet").read_bytes()).hexdigest()[:12]
    return {"family": family, "seed": seed, "classes": names, "videos": len(rendered),
            "train": sum(not v[3] for v in rendered), "test": sum(v[3] for v in rendered), "px": px, "frames": frames,
            "render_s": round(time.time() - t0, 2), "train_manifest_sha256": manifest}


# ---------------------------------------------------------------- job: paths


def pytest_gpu(job: Job) -> dict:
    log = job.work / "pytest.log"
    rc, secs = run_cmd([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                        "tests/test_gpu.py"], job, log=log, cap=240)
    text = log.read_text(errors="replace")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text.splitlines()[-1]
                                                  if text.strip() else "")}
    return {"exit_code": rc, "seconds": round(secs, 1), **counts,
            "failures": re.findall(r"^FAILED (\S+)", text, flags=re.M)}


def backbone_steps(job: Job) -> list[dict]:
    """Every row of moquad.models.backbones.BACKBONES (read now, so new rows are measured): SimCLR base and MoQuad
    steps at each (crop, batch) of the sizes; out-of-memory or any failure is a row with its error."""
    import torch
    from bench_gpu import time_step

    from moquad.models.backbones import BACKBONES

    s, cuda = job.sizes, job.args.device == "cuda"
    rows = []
    for name in BACKBONES:
        job.need(f"step table: {name}", 1.0 if job.args.tiny else 40.0)
        for size, batch in s.step_clips:
            row: dict = {"backbone": name, "frames": s.frames, "size": size, "batch": batch}
            for method, views in (("simclr", 2), ("moquad", 4)):
                try:
                    sec = time_step(size, batch, views, cuda, s.timed_steps, backbone=name, frames=s.frames,
                                    device=job.args.device, warmup=s.warmup_steps)
                    row[f"{method}_ms_per_video"] = 1e3 * sec / batch
                    row[f"{method}_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
                except Exception as e:  # noqa: BLE001 - out of memory, or a backbone that refuses this clip
                    row[f"{method}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    if cuda:
                        torch.cuda.empty_cache()
            if "simclr_ms_per_video" in row and "moquad_ms_per_video" in row:
                row["ratio"] = row["moquad_ms_per_video"] / row["simclr_ms_per_video"]
            print(f"[{job.name}] {row}", flush=True)
            rows.append(row)
    return rows


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (torchrun's ranks), read from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _log_steps(run: Path) -> list[int]:
    log = run / "log.jsonl"
    if not log.is_file():
        return []
    return [json.loads(x)["step"] for x in log.read_text().splitlines() if x.strip().startswith("{")]


def preempt_resume(job: Job, data: Path) -> dict:
    """torchrun (NCCL on CUDA with one rank per GPU; gloo with 2 ranks on CPU) ``moquad pretrain``; SIGUSR1 to
    every rank after 2 logged steps (as SLURM signals every task); then ``--resume`` to the end."""
    s, cuda = job.sizes, job.args.device == "cuda"
    import torch

    nproc = torch.cuda.device_count() if cuda else 2
    run = job.work / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           *moquad_cmd("pretrain", "--data", data, "--out", run, "--backbone", s.run_backbone, "--epochs",
                       s.run_epochs, "--batch-size", s.run_batch, "--frames", s.frames, "--size",
                       s.step_clips[0][0], "--workers", s.workers and 2, "--warmup-ratio", "0", "--device",
                       job.args.device)[1:]]
    t0 = time.time()
    with (job.work / "preempt.log").open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                start_new_session=True)
        while proc.poll() is None and len(_log_steps(run)) < 2 and time.time() - t0 < min(240, job.left() - 30):
            time.sleep(0.2)
        ranks = _children(proc.pid)
        t_sig = time.time()
        if len(_log_steps(run)) < 2 or not ranks:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"no 2 logged steps to interrupt (exit {proc.returncode}): "
                               f"{tail(job.work / 'preempt.log')}")
        for pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        try:
            rc = proc.wait(timeout=max(10, min(120, job.left() - 20)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError("the ranks did not stop within 120 s of SIGUSR1") from None
    stop_s = time.time() - t_sig
    from moquad.train.checkpoint import load

    ckpt_step = int(load(run / "checkpoints" / "last.pt")["step"])
    before = len(_log_steps(run))
    rc2, secs = run_cmd([*cmd, "--resume"], job, log=job.work / "resume.log", cap=300)
    steps = _log_steps(run)
    spe = json.loads((data / "dataset.json").read_text())["splits"]["train"] // s.run_batch
    return {"ranks": nproc, "backend": "nccl" if cuda else "gloo", "ranks_signalled": len(ranks),
            "exit_code_on_signal": rc, "preempted_line": next((x for x in (job.work / "preempt.log").read_text()
                                                               .splitlines() if "preempted:" in x), None),
            "seconds_signal_to_exit": round(stop_s, 2), "checkpoint_step": ckpt_step,
            "resume_exit_code": rc2, "resumed_first_step": steps[before] if len(steps) > before else None,
            "final_step": steps[-1] if steps else None, "expected_steps": spe * s.run_epochs,
            "resume_seconds": round(secs, 1), "checkpoint": str(run / "checkpoints" / "last.pt"),
            "note": "NCCL refuses two ranks on one GPU, so a 1-GPU machine runs 1 rank" if cuda else
            "CPU dry run: gloo, 2 ranks"}


def _newest_json(folder: Path, since: float) -> dict:
    found = sorted((p for p in folder.rglob("*.json") if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime)
    return json.loads(found[-1].read_text()) if found else {}


def eval_commands(job: Job, data: Path, ckpt: Path) -> list[dict]:
    """extract, retrieve, linear --fast, finetune (1 epoch), cam, motion: each a CLI subprocess on the device."""
    import pyarrow.parquet as pq

    s, dev, e = job.sizes, job.args.device, job.work / "eval"
    clip = ["--frames", s.frames, "--size", s.step_clips[0][0]]
    common = ["--data", data, "--checkpoint", ckpt, *clip, "--num-clips", 2, "--device", dev, "--set",
              f"workers={s.workers}"]
    video = pq.read_table(data / "manifests" / "test.parquet", columns=["video_id"]).column(0)[0].as_py()
    cmds = {"extract": ["extract", *common, "--out", e, "--split", "test"],
            "retrieve": ["retrieve", *common, "--out", e, "--json", e / "retrieve.json"],
            "linear --fast": ["linear", *common, "--out", e / "linear", "--fast"],
            "finetune 1 epoch": ["finetune", *common, "--out", e / "finetune", "--epochs", 1, "--batch-size", 8],
            "cam": ["cam", video, "--data", data, "--checkpoint", ckpt, *clip, "--eval-dir", e / "finetune",
                    "--out", e / "cam.png", "--device", dev],
            "motion": ["motion", f"run={ckpt}", "--data", data, "--out", e / "motion", "--max-videos", 16, *clip,
                       "--device", dev]}
    rows = []
    for name, args in cmds.items():
        job.need(f"eval: {name}", 1.0 if job.args.tiny else 30.0)
        t0 = time.time()
        log = job.work / f"eval_{name.split()[0]}.log"
        rc, secs = run_cmd(moquad_cmd(*args), job, log=log, cap=180)
        row = {"command": "moquad " + " ".join(map(str, args)), "exit_code": rc, "seconds": round(secs, 1)}
        if rc != 0:
            row["error"] = tail(log)
        elif name in ("linear --fast", "finetune 1 epoch", "retrieve"):
            res = _newest_json(e, t0)
            row.update({k: res[k] for k in ("top1", "top5", "knn_top1") if isinstance(res.get(k), (int, float))})
        print(f"[{job.name}] {name}: exit {rc}, {secs:.1f} s", flush=True)
        rows.append({"name": name, **row})
    return rows


def job_paths(job: Job) -> None:
    s = job.sizes
    job.step("pytest -m gpu", 120, pytest_gpu, job)
    job.step("steps", 150, backbone_steps, job)
    data = job.step("data", 20, render, job.work / "data", "directions", 0, 4 * s.data[1], s.data[2], s.data[3],
                    os.cpu_count() or 1)
    if data is None:
        return
    pre = job.step("preempt + resume", 90, preempt_resume, job, job.work / "data")
    if pre is not None:
        job.step("eval commands", 120, eval_commands, job, job.work / "data", Path(pre["checkpoint"]))


# ---------------------------------------------------------------- job: decode


def job_decode(job: Job) -> None:
    """``moquad pretrain`` (R3D-18, 16x112, batch 32) with at most 2 CPU cores (taskset) in each data path,
    against the same step on a synthetic batch already on the device (the GPU-bound rate)."""
    from bench_gpu import build_dataset, pretrain_run, time_step

    s, cuda = job.sizes, job.args.device == "cuda"
    size = s.step_clips[0][0]
    bound = job.step("gpu-bound", 20, time_step, size, s.decode_batch, 4, cuda, s.timed_steps,
                     backbone=s.run_backbone, frames=s.frames, device=job.args.device, warmup=s.warmup_steps)
    if bound is not None:
        job.figures["gpu-bound"] = {"ms_per_step": 1e3 * bound, "clips_per_s": 4 * s.decode_batch / bound}
    data = job.step("data", 40, build_dataset, job.work / "data", s.decode_videos, s.data[3], s.data[2], None,
                    os.cpu_count() or 1)
    if data is None:
        return
    prefix = ("taskset", "-c", "0,1") if shutil.which("taskset") and (os.cpu_count() or 1) >= 2 else ()
    rows = (("workers", 2), ("device", 2), ("gpu-decode", 1), ("gpu-decode", 2)) if cuda else \
        (("workers", 1), ("device", 1))
    for mode, workers in rows:
        name = f"e2e {mode} x{workers}"
        r = job.step(name, 40, pretrain_run, data, job.work / name.replace(" ", "_"), mode, workers, s.decode_batch,
                     s.decode_epochs, backbone=s.run_backbone, frames=s.frames, size=size, device=job.args.device,
                     prefix=prefix, drop=not job.args.tiny)
        if r is not None and "clips_per_s" in r and bound is not None:
            r["of_gpu_bound"] = r["clips_per_s"] / job.figures["gpu-bound"]["clips_per_s"]
            r["cpu_cores_allowed"] = 2 if prefix else os.cpu_count()


# ---------------------------------------------------------------- job: ladder


LADDER_RE = re.compile(r"ladder-(?P<family>[a-z-]+)-s(?P<seed>\d+)-(?P<method>\w+)$")


def ladder_methods() -> list[str]:
    """The floor, the base, MoQuad, and the momentum-encoder pair when METHODS has it (read at run time)."""
    from moquad.train.methods import METHODS

    return ["random", "simclr", "moquad", *(m for m in ("moco", "moco_moquad") if m in METHODS)]


def ladder_pretrain(job: Job, data: Path, method: str, seed: int, train_videos: int) -> dict:
    """``moquad pretrain --recipe train/cpu_demo.yaml`` at the ladder's GPU size for ladder_steps steps (whole
    epochs: the last one may add a few); stopped by SIGUSR1 at the budget, it keeps its checkpoint (partial)."""
    s = job.sizes
    spe = max(1, train_videos // s.ladder_batch)
    epochs = max(1, math.ceil(s.ladder_steps / spe))
    run = job.work / "run"
    backbone = "tiny" if job.args.tiny else "r3d_18"
    args = ["pretrain", "--data", data, "--out", run, "--recipe", "train/cpu_demo.yaml", "--method", method,
            "--seed", seed, "--backbone", backbone, "--epochs", epochs, "--batch-size", s.ladder_batch,
            "--frames", s.frames, "--size", s.step_clips[0][0], "--workers", s.ladder_workers, "--device",
            job.args.device, "--set", f"lr_warmup_epochs={max(1, epochs // 20)}", "--set", "ckpt_every=100"]
    if not job.args.tiny:
        args += ["--set", "lr=3.2", "--set", "proj_dim=128", "--set", "proj_hidden=2048"]
    if method == "random":
        from moquad import config as C
        from moquad import settings
        from moquad.quickstart import _save_untrained, demo_recipe

        cfg = settings.resolve(C.PretrainConfig(), demo_recipe("train/cpu_demo.yaml"), {
            "data": str(data), "out": str(run), "backbone": backbone, "seed": seed,
            **({} if job.args.tiny else {"proj_dim": 128, "proj_hidden": 2048})})
        _save_untrained(cfg, run / "checkpoints" / "last.pt")
        return {"command": "untrained network (quickstart._save_untrained)", "steps": 0}
    log = job.work / "pretrain.log"
    rc, secs = run_cmd(moquad_cmd(*args), job, log=log, margin=45.0 if not job.args.tiny else 2.0,
                       keep_stopped=True)
    recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()] if (run / "log.jsonl").is_file() \
        else []
    if rc not in (0, 75) or not recs:
        raise RuntimeError(f"pretrain exit {rc}: {tail(log)}")
    from motion_ladder import _ranks

    steady = recs[5:] or recs
    return {"command": "moquad " + " ".join(map(str, args)), "exit_code": rc, "seconds": round(secs, 1),
            "steps": recs[-1]["step"], "planned_steps": spe * epochs, "epochs": epochs,
            "clips_per_s": statistics.median(r["clips_per_s"] for r in steady),
            "data_wait": statistics.mean(r.get("data_wait", 0.0) for r in steady),
            "loss_first": recs[0]["loss"], "loss_last": recs[-1]["loss"], **_ranks(run)}


def ladder_eval(job: Job, data: Path) -> dict:
    """Retrieval hit@k, weighted kNN and the fast linear probe on one set of cached features (CLI subprocesses)."""
    s, e = job.sizes, job.work / "eval"
    common = ["--data", data, "--checkpoint", job.work / "run" / "checkpoints" / "last.pt", "--recipe",
              "eval/cpu_demo.yaml", "--frames", s.frames, "--size", s.step_clips[0][0], "--num-clips", s.eval_clips,
              "--device", job.args.device, "--out", e, "--set", f"workers={s.ladder_workers}"]
    out: dict = {}
    for name, extra in (("retrieve", ["--json", e / "retrieve.json"]), ("linear", ["--fast"])):
        t0 = time.time()
        rc, secs = run_cmd(moquad_cmd(name, *common, *extra), job, log=job.work / f"{name}.log", cap=240)
        if rc != 0:
            raise RuntimeError(f"{name} exit {rc}: {tail(job.work / f'{name}.log')}")
        res = _newest_json(e, t0)
        out[f"{name}_s"] = round(secs, 1)
        if name == "retrieve":
            out.update({f"hit@{k}": res[f"top{k}"] for k in (1, 5, 10) if f"top{k}" in res},
                       knn_top1=res["knn_top1"])
        else:
            out["linear_top1"] = res["top1"]
    return out


def job_ladder(job: Job) -> None:
    m = LADDER_RE.match(job.name)
    s = job.sizes
    family, seed, method = m["family"], int(m["seed"]), m["method"]
    if method not in ladder_methods():
        raise ValueError(f"{job.name}: unknown method {method!r}; choose one of {', '.join(ladder_methods())}")
    key = f"{family}-s{seed}-{'tiny' if job.args.tiny else 'gpu'}"
    data = Path(job.args.work) / "ladder-data" / key  # shared by the ladder jobs of one run
    if (data / "render.json").is_file():
        job.figures["data"] = json.loads((data / "render.json").read_text())
    else:
        shutil.rmtree(data, ignore_errors=True)
        info = job.step("data", 40, render, data, family, seed, s.ladder_videos, *s.ladder_px, os.cpu_count() or 1)
        if info is None:
            return
        (data / "render.json").write_text(json.dumps(info))
    pre = job.step("pretrain", dict(SIZES["gpu"].estimates)[method] - 80, ladder_pretrain, job, data, method, seed,
                   job.figures["data"]["train"])
    if pre is not None:
        job.step("eval", 40, ladder_eval, job, data)
        if pre.get("exit_code") == 75:
            job.errors["pretrain"] = f"stopped at the budget after {pre['steps']} of {pre['planned_steps']} steps"


# ---------------------------------------------------------------- the campaign


JOBS = {"paths": job_paths, "decode": job_decode}  # and ladder-<family>-s<seed>-<method> (LADDER_RE)


def expand(names: list[str]) -> list[str]:
    """``ladder`` -> the default ladder jobs; ``ladder-<family>-s<seed>`` -> its method jobs."""
    out = []
    for n in names:
        if n == "ladder":
            n = "ladder-directions-s0"
        if re.fullmatch(r"ladder-[a-z-]+-s\d+", n):
            out += [f"{n}-{m}" for m in ladder_methods()]
        elif n in JOBS or LADDER_RE.match(n):
            out.append(n)
        else:
            raise SystemExit(f"error: unknown job {n!r}; choose from {', '.join(JOBS)}, ladder, "
                             "ladder-<family>-s<seed>[-<method>]")
    return list(dict.fromkeys(out))


def estimate(name: str, sizes: Sizes) -> float:
    """A job's estimated seconds (a ladder job: its method's)."""
    est, m = dict(sizes.estimates), LADDER_RE.match(name)
    return est.get(m["method"] if m else name, est["moquad"])


def is_done(name: str, args: argparse.Namespace, code: str) -> bool:
    for folder in {Path(args.out).resolve(), DOCS.resolve()}:
        f = folder / f"{name}.json"
        if f.is_file():
            r = json.loads(f.read_text())
            if r.get("status") == "done" and r.get("code_hash") == code and r.get("tiny") == args.tiny and \
                    r.get("device", {}).get("kind") == args.device:
                return True
    return False


def _finite(v):
    """NaN and infinities as null: the records are strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return [_finite(x) for x in v] if isinstance(v, (list, tuple)) else v


def write_record(job: Job, status: str, message: str, base: dict, t0: float) -> Path:
    rec = {"job": job.name, "status": status, "message": message, **base, "tiny": job.args.tiny,
           "seconds": round(time.time() - t0, 1), "step_seconds": job.seconds, "errors": job.errors,
           "figures": job.figures}
    out = Path(job.args.out) / f"{job.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(rec), indent=1, default=str))
    tmp.replace(out)
    return out


def campaign(args: argparse.Namespace) -> int:
    t_start = time.time()
    deadline = t_start + args.budget_s
    missing = ensure_wheels()
    code = code_hash()
    # imported after reexec_on_path: the bare GPU machine has moquad on the path only
    from moquad.record import commit, machine

    base = {"device": device_info(args.device), **commit(), "code_hash": code, "machine": machine(),
            "load": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join(["python", "experiments/gpu_campaign.py", *sys.argv[1:]]), "missing_modules": missing,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    print(f"campaign: {base['device'].get('name')}, torch {base['device']['torch']}, code {code}, "
          f"budget {args.budget_s:.0f} s", flush=True)
    sizes = SIZES["tiny" if args.tiny else "gpu"]
    names = expand(args.jobs.split(",")) if args.jobs else \
        [n for n in expand(["paths", "decode", "ladder"]) if not is_done(n, args, code)]
    if not names:
        print("campaign: every job is done for this code (docs/results/gpu/); name jobs with --jobs to run them again")
    for name in names:
        left = deadline - time.time()
        if left < estimate(name, sizes):
            print(f"campaign: skipped {name}: needs ~{estimate(name, sizes):.0f} s, {left:.0f} s left (the next run "
                  "takes it)")
            continue
        job, t0 = Job(name, args, deadline), time.time()
        try:
            (job_ladder if name.startswith("ladder-") else JOBS[name])(job)
            status, message = "done", "" if not job.errors else f"{len(job.errors)} step(s) failed: {list(job.errors)}"
        except OutOfTime as e:
            status, message = "partial", f"budget ran out: {e}; run the campaign again to finish this job"
        path = write_record(job, status, message, base, t0)
        print(f"campaign: {name} {status} in {time.time() - t0:.0f} s -> {path}" + (f" ({message})" if message else ""),
              flush=True)
        if status == "partial":
            print(f"campaign: stopped at the budget ({args.budget_s:.0f} s): {message}")
            break
    return 0


def collect(src: str) -> int:
    """Copy the campaign JSONs an allocation wrote (its ``--out`` folder, copied back) into docs/results/gpu/."""
    files = sorted(Path(src).glob("*.json"))
    DOCS.mkdir(parents=True, exist_ok=True)
    for f in files:
        json.loads(f.read_text())  # a JSON, whole
        shutil.copy2(f, DOCS / f.name)
        print(f"{f} -> {DOCS / f.name}")
    if not files:
        print(f"error: no campaign JSON in {src}", file=sys.stderr)
        return 2
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=540.0, help="seconds this run may use: the allocation's time "
                    "limit less its start-up and the copy back (a job is not started when its estimate does not fit; "
                    "a step is not started when its own does not)")
    ap.add_argument("--jobs", default="", help="comma list: paths, decode, ladder, ladder-<family>-s<seed>[-<method>]"
                    " (default: every job not yet done for this code)")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"), help="default: cuda when available")
    ap.add_argument("--tiny", action="store_true", help="toy sizes: the CPU dry run of the test suite")
    ap.add_argument("--out", default=str(DOCS), help="folder of the JSONs (default docs/results/gpu; on a remote "
                    "machine, a folder you copy back)")
    ap.add_argument("--work", default="/tmp/moquad_campaign", help="scratch folder (data, runs)")
    ap.add_argument("--collect", default=None, metavar="DIR", help="only copy DIR/*.json into docs/results/gpu/")
    ap.add_argument("--download-command", action="store_true", help="print the command that downloads the wheels")
    ap.add_argument("--step-estimate-scale", type=float, default=1.0, help="multiply every step's time estimate "
                    "(the budget test sets it high: the first step cannot fit, whatever the machine's load)")
    args = ap.parse_args()
    if args.download_command:
        print(DOWNLOAD)
        return
    if args.collect:
        sys.exit(collect(args.collect))
    reexec_on_path()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sys.exit(campaign(args))


if __name__ == "__main__":
    main()
