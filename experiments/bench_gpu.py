"""GPU throughput: the training step (SimCLR base vs MoQuad), end-to-end ``moquad pretrain`` from shards in its
three data paths, and the GPU JPEG decoder. Run on a CUDA machine: ``python experiments/bench_gpu.py``
(``PYTHONPATH=.`` first where moquad is not installed).

1. **Step**: R3D-18, bf16 autocast, LARS, forward + loss + backward + step on random normalised clips, at
   16x112^2 (batch 32 per GPU, the paper's 256 over 8 GPUs) and 16x224^2 (batch 16), with and without
   ``channels_last_3d``; median of ``--steps`` steps after 3 warm-up steps (CUDA events). MoQuad feeds 4
   clips per video, the SimCLR base 2: the ratio's floor is 2x.
2. **End to end**: ``moquad pretrain`` as a user runs it (subprocess, ``--workers 16``, 16x112^2, batch 32,
   one epoch of the dataset below), in the three data paths: augmentation in the workers (``workers``),
   ``--augment-on-device`` (``device``) and ``--set loader.decode_on_device=true`` (``gpu-decode``). Clips/s
   and the data-wait fraction come from the run's log.jsonl (steps after the 5th); GPU-busy % is the mean
   NVML utilisation sampled every 100 ms over the same steps. The page cache is dropped before each run
   when this process may do so (root in a VM), so shards are read from disk.
3. **Decode**: the loader alone, batches consumed by ``to_model`` on the GPU (no network): clips/s and CPU
   cores used (the workers' and this process's CPU time over wall time) for augmentation in the workers
   (``workers``), CPU decode with augmentation on the GPU (``device``) and GPU decode (``gpu-decode``), the
   workers' shared batch buffers recycled (``pipeline.BufferRing``, on with pin_memory) or fresh per batch (before).
   ``--repeats 3 --warm``: medians of interleaved runs with the page cache kept.

The tables go to ``docs/results/bench_gpu.json`` (``--record``), which the GPU page renders.

Dataset: ``moquad synth`` videos rendered at 128 px (``--videos``, 64 frames, types family) written with
``moquad.preprocess.frames.write_frames`` (no ffmpeg needed), plus the real clips of ../shared/data (their
JPEG frames from ``--real`` shards preprocessed at short side 128), ~1.2 GB: more than a loader's buffers,
read from disk each epoch once the page cache is dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import simplejpeg
import torch

from moquad.config import LoaderConfig
from moquad.data.augment import to_model
from moquad.data.pipeline import make_loader
from moquad.data.store import Split
from moquad.preprocess.frames import write_frames
from moquad.record import Record, add_argument
from moquad.synth import MOTIONS, synth_videos

QUAD = ("anchor", "positive", "intra_negative", "intra_negative")  # the quadruple's roles
MODES = {"workers": [], "device": ["--augment-on-device"], "gpu-decode": ["--set", "loader.decode_on_device=true"]}


# ---------------------------------------------------------------- dataset


def _render_chunk(args: tuple) -> list[tuple[str, list[bytes], int, bool]]:
    """One chunk of synthetic videos as JPEG frames: ``(video_id, jpegs, label 0.., test?)``. ``args``: (chunk,
    per_class, size, frames[, kind, classes, seed, synth_videos' other arguments]); a chunk's seed is ``seed * 100_003 + chunk``, so a chunk is the
    same whatever the number of processes (the GPU campaign renders its ladder families with it)."""
    chunk, per_class, size, frames, *rest = args
    kind, classes, seed, extra = rest or ("types", len(MOTIONS), 0, {})
    out = []
    for rel, label, test, video in synth_videos(classes, per_class, size, frames, seed=seed * 100_003 + 1000 + chunk,
                                                kind=kind, **extra):
        jpegs = [simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=90) for f in video]
        out.append((f"c{chunk:03d}/{rel}", jpegs, label - 1, test))
    return out


def build_dataset(out: Path, videos: int, frames: int, size: int, real: Path | None, procs: int) -> Path:
    if (out / "manifests" / "train.parquet").is_file():
        return out
    per_class = 2  # small chunks spread over the processes
    chunks = [(c, per_class, size, frames) for c in range(max(1, videos // (len(MOTIONS) * per_class)))]
    classes = list(MOTIONS) + ["real"]

    def all_videos():
        with Pool(procs) as pool:
            for chunk in pool.imap_unordered(_render_chunk, chunks):
                yield from (v[:3] for v in chunk)
        if real is not None:
            split = Split(real, "train")
            for i in range(len(split)):
                payload, fo = split.payload(i), split.frame_offsets(i)
                yield (f"real/{split.video_id[i]}", [payload[fo[f]:fo[f + 1]] for f in range(len(fo) - 1)],
                       len(MOTIONS))

    t0 = time.time()
    write_frames(out, all_videos(), classes=classes, videos_per_shard=256)
    size_gb = sum(p.stat().st_size for p in (out / "shards").glob("*.tar")) / 1e9
    print(f"dataset: {len(Split(out))} videos, {size_gb:.2f} GB of shards, built in {time.time() - t0:.0f} s")
    return out


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- 1. step


def time_step(size: int, batch: int, views: int, channels_last: bool, steps: int, *, backbone: str = "r3d_18",
              frames: int = 16, device: str = "cuda", warmup: int = 3) -> float:
    """Median seconds of one training step (forward + loss + backward + LARS step; bf16 autocast on CUDA) of
    ``backbone`` on random clips already on ``device``, after ``warmup`` steps; CUDA's peak memory statistics are
    reset first (read ``torch.cuda.max_memory_allocated()`` after)."""
    from moquad.config import PretrainConfig
    from moquad.models import build_model
    from moquad.train.loop import forward_loss
    from moquad.train.optimizers import make_optimizer

    torch.manual_seed(0)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = PretrainConfig(backbone=backbone)
    model = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden).to(device).train()
    x = torch.randn(batch, views, 3, frames, size, size, device=device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    opt = make_optimizer(model, "lars", 0.1, 1e-6)
    roles, video = QUAD[:views], torch.arange(batch, device=device)
    times = []
    for i in range(steps + warmup):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, _ = forward_loss(model, x, roles, "moquad.train.losses:quadruple", tau=0.1, hard_beta=0.01,
                               hard_alpha=1.5, video=video)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    del model, x, opt
    if cuda:
        torch.cuda.empty_cache()
    return statistics.median(times)


def step_table(steps: int) -> list[dict]:
    rows = []
    for size, batch in ((112, 32), (224, 16)):
        for cl in (False, True):
            sim = time_step(size, batch, 2, cl, steps)
            quad = time_step(size, batch, 4, cl, steps)
            rows.append({"size": size, "batch": batch, "channels_last_3d": cl, "simclr_ms_per_video": 1e3 * sim / batch,
                         "moquad_ms_per_video": 1e3 * quad / batch, "ratio": quad / sim})
            print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- 2. end to end


class GpuSampler(threading.Thread):
    """NVML GPU utilisation every 100 ms, with timestamps."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no NVML (no NVIDIA driver, or nvidia-ml-py missing): no samples, busy = nan
            return
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self.stop.is_set():
            self.samples.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            time.sleep(0.1)


def pretrain_run(data: Path, run: Path, mode: str, workers: int, batch: int, epochs: int, *, backbone: str = "r3d_18",
                 frames: int = 16, size: int = 112, device: str = "cuda", prefix: tuple[str, ...] = (),
                 drop: bool = True) -> dict:
    """``moquad pretrain`` in a subprocess (``prefix``: e.g. ``taskset -c 0,1``), its steady clips/s and data wait
    from log.jsonl and the GPU's mean NVML utilisation over the same steps; ``drop``: the page cache first."""
    dropped = drop and drop_page_cache()
    cmd = [*prefix, sys.executable, "-m", "moquad.cli", "pretrain", "--data", str(data), "--out", str(run),
           "--backbone", backbone, "--epochs", str(epochs), "--batch-size", str(batch), "--frames", str(frames),
           "--size", str(size), "--workers", str(workers), "--warmup-ratio", "0", "--device", device,
           "--set", "log_every=1", *MODES[mode]]
    sampler = GpuSampler()
    sampler.start()
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    sampler.stop.set()
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return {"mode": mode, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    steady = recs[5:] or recs
    t_from = steady[0]["time"] - 1.0  # the log's wall times bound the steady phase
    busy = [u for t, u in sampler.samples if t_from <= t <= steady[-1]["time"]]
    return {"mode": mode, "steps": len(recs), "wall_s": wall, "page_cache_dropped": dropped,
            "clips_per_s": statistics.median(r["clips_per_s"] for r in steady),
            "data_wait": statistics.mean(r["data_wait"] for r in steady),
            "gpu_busy": statistics.mean(busy) if busy else float("nan")}


# ---------------------------------------------------------------- 3. decode


def loader_throughput(data: Path, mode: str, workers: int, batch: int, batches: int, recycle: bool = True,
                      drop: bool = True) -> dict:
    """The loader alone feeding ``to_model`` on the GPU: clips/s and CPU cores used; ``recycle``: the workers reuse
    their shared batch buffers (pipeline.BufferRing, on with pin_memory) or make fresh ones (before); ``drop``: the
    page cache dropped first (shards read from disk)."""
    cfg = LoaderConfig(frames=16, size=112, workers=workers, augment_on_device=mode != "workers",
                       decode_on_device=mode == "gpu-decode")
    if drop:
        drop_page_cache()
    self0, child0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, n = time.time(), 0
    for i, b in enumerate(make_loader(data, cfg, batch_size=batch, num_batches=batches, pin_memory=True,
                                      recycle=recycle)):
        to_model(b, "cuda", 112)
        if i == 1:  # after the workers' start-up
            torch.cuda.synchronize()
            t0, n = time.time(), 0
            self0, child0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            continue
        n += batch
    torch.cuda.synchronize()
    wall = time.time() - t0
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (s1.ru_utime + s1.ru_stime - self0.ru_utime - self0.ru_stime
           + c1.ru_utime + c1.ru_stime - child0.ru_utime - child0.ru_stime)
    return {"mode": mode, "workers": workers, "recycle": recycle, "clips_per_s": 4 * n / wall, "cpu_cores": cpu / wall}


DECODE_ROWS = (("workers", 2, False), ("workers", 2, True), ("workers", 8, False), ("workers", 8, True),
               ("device", 2, False), ("device", 2, True), ("device", 8, True), ("gpu-decode", 1, True),
               ("gpu-decode", 2, True))  # (data path, workers, recycled buffers)


def decode_rows(data: Path, repeats: int, drop: bool) -> list[dict]:
    """:data:`DECODE_ROWS`, interleaved over ``repeats`` (every other repeat in reverse order), medians per row."""
    if not drop:
        loader_throughput(data, "workers", 2, 32, 10, drop=False)  # the shards into the page cache
    runs: dict[tuple, list[dict]] = {r: [] for r in DECODE_ROWS}
    for rep in range(repeats):
        for row in DECODE_ROWS if rep % 2 == 0 else DECODE_ROWS[::-1]:
            runs[row].append(loader_throughput(data, *row[:2], 32, 40, row[2], drop))
            print(runs[row][-1], flush=True)
    return [{**v[0], **{k: statistics.median(x[k] for x in v) for k in ("clips_per_s", "cpu_cores")},
             "clips_per_cpu_s": statistics.median(x["clips_per_s"] / x["cpu_cores"] for x in v), "repeats": len(v)}
            for v in runs.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/moquad_gpu_data")
    ap.add_argument("--real", default=None, help="shards of the real clips (moquad preprocess, short side 128)")
    ap.add_argument("--videos", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--skip", default="", help="comma list of sections to skip: step,e2e,decode")
    ap.add_argument("--e2e-modes", default=",".join(MODES), help="comma list of the end-to-end data paths to run")
    ap.add_argument("--repeats", type=int, default=1, help="decode rows: interleaved repeats (medians)")
    ap.add_argument("--warm", action="store_true", help="decode rows: keep the page cache (CPU, not disk)")
    ap.add_argument("--json", default=None)
    add_argument(ap, "bench_gpu")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    rec = Record("bench_gpu")
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(result, flush=True)
    if "step" not in skip:
        result["step"] = step_table(args.steps)
    data = build_dataset(Path(args.data), args.videos, 64, 128, Path(args.real) if args.real else None, 16)
    if "decode" not in skip:
        result["decode"] = decode_rows(data, args.repeats, not args.warm)
    if "e2e" not in skip:
        result["e2e"] = [pretrain_run(data, Path(f"/tmp/moquad_gpu_runs/{m}"), m, args.workers, 32, args.epochs)
                         for m in args.e2e_modes.split(",")]
        for r in result["e2e"]:
            print(r, flush=True)
    record_tables(rec, result)
    rec.write(args.record)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


PATHS = {"workers": "augmentation in the workers", "device": "`--augment-on-device`",
         "gpu-decode": "nvJPEG decode + augmentation on the GPU"}  # the data paths' names in the tables


def record_tables(rec: Record, r: dict) -> None:
    """The step, end-to-end and loader tables of a result (``r``: what ``--json`` writes) into ``rec``."""
    rec.figures.update(r)
    if "step" in r:
        rec.table("step", ["clip", "batch/GPU", "channels-last 3D", "SimCLR ms/video", "MoQuad ms/video", "ratio"],
                  [[f"16×{s['size']}²", s["batch"], "yes" if s["channels_last_3d"] else "no",
                    f"{s['simclr_ms_per_video']:.2f}", f"{s['moquad_ms_per_video']:.2f}", f"{s['ratio']:.2f}"]
                   for s in r["step"]], align="lrlrrr",
                  title="R3D-18 training step, bf16: SimCLR base (2 clips per video) against MoQuad (4)")
    for key in ("e2e", "e2e_channels_last"):
        if key in r:
            rows = [[PATHS.get(e["mode"], e["mode"]), f"failed: {e['error']}", "", "", ""] if "error" in e else
                    [PATHS.get(e["mode"], e["mode"]), f"{e['clips_per_s']:.0f}", f"{e['gpu_busy']:.0f}",
                     f"{e['data_wait']:.3f}", e["steps"]] for e in r[key]]
            rec.table(key, ["`moquad pretrain`, 16 workers", "clips/s", "GPU busy %", "data wait", "steps"], rows,
                      title="End to end, R3D-18 16×112², batch 32" + (", channels-last 3D" if key != "e2e" else ""))
    if "decode" in r:
        rec.table("decode", ["the loader alone", "workers", "worker buffers", "clips/s", "CPU cores", "clips per CPU s"],
                  [[PATHS.get(d["mode"], d["mode"]), d["workers"], "recycled" if d.get("recycle", True) else "fresh",
                    f"{d['clips_per_s']:,.0f}", f"{d['cpu_cores']:.2f}", f"{d['clips_per_s'] / d['cpu_cores']:.0f}"]
                   for d in r["decode"]], align="lrlrrr", title="The loader alone, batches of 32 to `to_model` on the GPU")


if __name__ == "__main__":
    main()
