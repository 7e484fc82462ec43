"""Loader throughput and bytes read: MoQuad quadruples/s per worker process, on real K400-like clips.

Rows (one process doing the work of one DataLoader worker: ``workers=0``, one torch thread):

1. ``shards``: the real loader (``make_loader``): read each sample's payload by offset, check its
   xxh3 checksum, draw the view parameters, decode the frames the views use, RAD donors (one frame of
   random other videos, read by index), ``apply_views`` (crop/resize/flip, colour, RAD) and rounding
   to uint8. ``no checksum``: the same with ``verify_checksums=False`` (the checksum's cost).
   ``augment on device (worker side)``: ``augment_on_device=True``: the worker stops after decoding;
   ``apply_views`` then runs on the accelerator. ``apply_views on CPU``: what the default path's workers add
   after that, alone: ``apply_views(quantize=True)`` (uint8 views, as the workers call it) on those batches.
2. ``PyAV``: the SAME quadruples (same frames, same parameters, same ``apply_views``) from the source
   videos, seeking and decoding each clip with PyAV the way pytorchvideo loads.
3. ``decode bound``: only the JPEG decode of the distinct frames each quadruple uses (payloads already
   in memory): what a loader could reach if everything but decoding were free.

Setup: the 5 Kinetics clips of ../shared/data/real-videos (340x256) preprocessed at short side 128,
each copied 8 times under different names (40 distinct files: preprocessing skips a second path to the
same file, so symlinks would leave 5 videos; batches of 8, exact epochs), 16-frame clips,
112 crops, dilations {1, 2, 4}, batches of 8. Times are CPU seconds of this process (``--wall`` for
wall clock); paths are interleaved over ``--repeats`` epochs and the table shows medians. Timed epochs drop
each batch as it comes (the process reuses its memory, :func:`run_loader`); a real worker's batches travel in
shared memory instead, which these rows leave out and the next table measures: ONE real DataLoader worker of the
trainer's run loader (kept across epochs, each batch copied out as it arrives, as pin_memory does), its own CPU
time, with fresh shared buffers per batch (allocated and faulted in page by page, ~0.7 ms per MB on a small VM) and
recycled ones (``pipeline.BufferRing``, the trainer's), for both worker paths.

A table of what one JPEG decode costs (simplejpeg / libjpeg-turbo, full size, 1/2, 1/4, 1/8, luma only, the fast
IDCT and upsampling) on the 128-px and 256-px frames shows where a decode's time goes: entropy decoding, which no
option skips.

The second table is the bytes the loader reads per epoch against the bytes of the videos it uses
(payloads) plus the RAD donor frames, for 1 rank and for 8 simulated ranks (the number of workers does
not change it: each batch is read by exactly one worker).

The third table, reduced-size decoding (``scaled_decode``, on by default), runs the same loader on the same
clips preprocessed at short side 256 (340x256, as Kinetics is usually stored), 112 crops, the default crop scales
(0.3, 1.0) of the area (CVRL's, which the paper follows): the loader and its worker side (``augment_on_device``)
with and without it, and the decode bound three ways: full size, at the reductions the loader chose (a frame at
1/2 when every crop using it keeps >= 112 px at that scale), and every frame at 1/2 (the ceiling at this
setting). Ratios are to the full-size decode bound; an untimed warm-up epoch comes first and the order of
with / without alternates per repeat.

The fourth table reads the same dataset from servers on 127.0.0.1, with the same loader settings and workers
as the local-disk row, timed by the wall clock over whole epochs (the loader built, its manifest read, every
batch) and in the steady state (from the end of each epoch's first batch, which has no read-ahead: an epoch of a
real dataset is thousands of batches), the sources interleaved per repeat, medians and the ratio to local disk
measured in the same process. Sources: moto's S3 API (started here, as in the tests; it reads a whole object
for each ranged GET, hence shards of ~1 MB of source video (~3 MB) for every row, and its CPU competes with the
loader's), plain and + 20 / 50 ms per sample read by the proxy in this process; nginx serving the dataset
folder over http:// (a generated config in a temp folder, run as this user in the foreground, its own pid and
logs; Range is built in), plain and through a latency proxy in its own process adding 0, 20 and 50 ms to EVERY
request (the 0 ms row is the proxy's own cost). nginx is for the benchmark only: ``apt-get install -y
nginx-light`` (or ``nginx``); without it on PATH the nginx rows are skipped with a line saying so. "sent / read"
is the sample bytes the server sent (the S3 proxy's count, nginx's access log) per byte the loader counted.
Run: ``nice python benchmarks/bench_loader.py`` (``--rows local``: every table but the object-storage one, which
needs moto (and nginx for its http rows); ``--rows main``: the first table and the real worker's; ``--rows s3``:
the object-storage table; ``--rows scaled``: the reduced-size decoding table and the one-frame decode table). The
tables go to ``docs/results/bench_loader.json`` (``--record``), which the Benchmarks page renders.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from benchdata import BATCH, REAL, build_dataset, clock, pyav_frames, run_decode_bound, run_loader

from moquad.config import LoaderConfig
from moquad.data.augment import apply_views
from moquad.data.pipeline import make_loader
from moquad.data.store import Split, reduced_hw
from moquad.record import Record, add_argument


def run_pyav(batches: list[dict], sources: dict[str, str], size: int) -> float:
    """The same quadruples from the source videos: one PyAV seek + decode per clip, a short-side resize to
    the shards' size (pytorchvideo's ShortSideScale), then apply_views."""
    total = 0.0
    for b in batches:
        t0 = clock()
        raw = torch.zeros_like(b["raw"])
        h, w = raw.shape[2:4]
        for i, vid in enumerate(b["video_id"]):
            frames: dict[int, np.ndarray] = {}
            for idx in b["info"][i]["indices"]:
                frames.update(pyav_frames(sources[vid], np.asarray(idx)))
            x = torch.from_numpy(np.stack([frames[f] for f in sorted(frames)])).permute(0, 3, 1, 2)
            x = torch.nn.functional.interpolate(x, size=(h, w), mode="bilinear", antialias=True)
            raw[i, : len(x)] = x.permute(0, 2, 3, 1)
        apply_views({**b, "raw": raw}, size, quantize=True)
        total += clock() - t0
    return total


def run_apply_on_cpu(batches: list[dict], size: int) -> float:
    """Seconds of ``apply_views`` on the batches as the workers run it: uint8 views (``quantize=True``)."""
    t0 = clock()
    for b in batches:
        apply_views(b, size, quantize=True)
    return clock() - t0


def bytes_table(data: Path, cfg: LoaderConfig, split: Split) -> list[tuple]:
    """Bytes read in one epoch vs the payload bytes of the videos used, for 1 and 8 simulated ranks."""
    rows = []
    for world, per_rank in ((1, BATCH), (8, len(split) // 8)):
        read = used = videos = 0
        for rank in range(world):
            for b in make_loader(data, dataclasses.replace(cfg, augment_on_device=True), batch_size=per_rank,
                                 rank=rank, world_size=world):
                read += b["bytes"]
                idx = b["index"].numpy()
                used += int(split.size[idx].sum())
                videos += len(idx)
        rows.append((world, per_rank, videos, used, read))
    return rows


def loader_rows(data: Path, cfg: LoaderConfig, split: Split, sources: dict[str, str],
                repeats: int) -> tuple[dict[str, list[float]], list[int]]:
    """Quadruples/s of every path of the main table per repeat, and the distinct frames per quadruple."""
    names = ("shards", "no checksum", "augment on device (worker side)", "PyAV", "decode bound", "apply_views on CPU")
    rate: dict[str, list[float]] = {k: [] for k in names}
    frames_per_quad = []
    for rep in range(repeats):  # interleaved: a change of load hits every path
        t, n, _ = run_loader(data, cfg, rep)
        rate["shards"].append(n / t)
        t, n, _ = run_loader(data, dataclasses.replace(cfg, verify_checksums=False), rep)
        rate["no checksum"].append(n / t)
        t, n, _ = run_loader(data, dataclasses.replace(cfg, augment_on_device=True), rep)
        rate["augment on device (worker side)"].append(n / t)
        _, _, raw = run_loader(data, dataclasses.replace(cfg, augment_on_device=True), rep, keep=True)  # untimed
        rate["PyAV"].append(n / run_pyav(raw, sources, cfg.size))
        rate["decode bound"].append(n / run_decode_bound(raw, split))
        rate["apply_views on CPU"].append(n / run_apply_on_cpu(raw, cfg.size))
        frames_per_quad += [len(np.unique(np.concatenate([np.asarray(x) for x in i["indices"]])))
                            for b in raw for i in b["info"]]
    return rate, frames_per_quad


WORKER_ROWS = ("1 worker, fresh shared buffers", "1 worker, recycled buffers (pin_memory: CUDA runs)",
               "1 worker, augment on device, fresh shared buffers", "1 worker, augment on device, recycled buffers")


def _task_cpu(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` so far (/proc schedstat: nanoseconds, not 10 ms ticks)."""
    return sum(int((t / "schedstat").read_text().split()[0]) for t in Path(f"/proc/{pid}/task").iterdir()) / 1e9


def worker_rows(data: Path, cfg: LoaderConfig, repeats: int) -> dict[str, list[float]]:
    """Quadruples per CPU second of a real DataLoader worker (the trainer's RunLoader, one kept worker, batches
    copied out as they arrive, as pin_memory does), with fresh shared buffers per batch and recycled ones
    (pipeline.BufferRing): the cost the rows above leave out. CPU of the worker process only."""
    from moquad.data.pipeline import RunLoader

    rate: dict[str, list[float]] = {k: [] for k in WORKER_ROWS}
    paths = [(name, dataclasses.replace(cfg, workers=1, augment_on_device=dev), recycle)
             for name, (dev, recycle) in zip(WORKER_ROWS, ((False, False), (False, True), (True, False), (True, True)))]
    runs = {name: RunLoader(data, c, batch_size=BATCH, recycle=recycle) for name, c, recycle in paths}
    key = {False: "views", True: "raw"}
    for rep in range(-1, repeats):  # epoch -1: warm-up (workers start, first page faults)
        for name, c, recycle in paths:
            run, n = runs[name], 0
            loader = make_loader(run, c, batch_size=BATCH, epoch=rep + 1, recycle=recycle)
            it = iter(loader)
            pid = it._workers[0].pid
            before = _task_cpu(pid)
            for b in it:
                b[key[c.augment_on_device]].clone()  # what pin_memory does: the batch copied out as it arrives
                n += len(b["video_id"])
            if rep >= 0:
                rate[name].append(n / (_task_cpu(pid) - before))
    for run in runs.values():
        run.close()
    return rate


def print_workers(rec: Record, rate: dict[str, list[float]], bound: float, repeats: int) -> None:
    med = {k: statistics.median(v) for k, v in rate.items()}
    rec.figures["worker quadruples per CPU s"] = med
    rec.table("workers", ["a real worker", "quadruples / CPU s", "vs decode bound"],
              [[name, f"{med[name]:.1f}", f"{med[name] / bound:.2f}x"] for name in WORKER_ROWS],
              title="A real DataLoader worker (kept across epochs, as the trainer runs it; batches copied out as they "
                    f"arrive, as pin_memory does): quadruples per CPU second of the worker process, median of {repeats}"
                    " epochs",
              notes=[f"Recycled against fresh buffers: {med[WORKER_ROWS[1]] / med[WORKER_ROWS[0]]:.2f}x (augmentation "
                     f"in the worker), {med[WORKER_ROWS[3]] / med[WORKER_ROWS[2]]:.2f}x (augmentation on the device)."])


SCALED_ROWS = ("shards, scaled decode (default)", "shards, full-size decode (scaled_decode=False)",
               "augment on device (worker side), scaled", "augment on device (worker side), full-size",
               "decode bound, full size", "decode bound, scaled (the loader's reductions)",
               "decode bound, every frame at 1/2 (ceiling)")
SCALED_GOAL = 1.5  # the scaled decode bound vs the full-size decode bound


def scaled_rows(data: Path, cfg: LoaderConfig, split: Split, repeats: int) -> tuple[dict[str, list[float]], list]:
    """Quadruples/s of the reduced-size decoding table (256-px frames) per repeat, and every decoded frame's
    reduction."""
    rate: dict[str, list[float]] = {k: [] for k in SCALED_ROWS}
    off = dataclasses.replace(cfg, scaled_decode=False)
    paths = list(zip(SCALED_ROWS[:4], (cfg, off, dataclasses.replace(cfg, augment_on_device=True),
                                      dataclasses.replace(off, augment_on_device=True))))
    reductions: list[int] = []
    run_loader(data, paths[2][1], 0)  # warm-up: the first epoch of a process pays for its first page faults
    for rep in range(repeats):  # interleaved, as the main table; with and without in turn first
        for name, c in paths if rep % 2 == 0 else [paths[k] for k in (1, 0, 3, 2)]:
            t, n, _ = run_loader(data, c, rep)
            rate[name].append(n / t)
        _, _, raw = run_loader(data, paths[2][1], rep, keep=True)  # the worker side's batches again, untimed
        for name, how in zip(SCALED_ROWS[4:], ("none", "loader", "half")):
            rate[name].append(n / run_decode_bound(raw, split, how))
        reductions += [int(r) for b in raw for i in b["info"] for r in i["reduce"]]
    return rate, reductions


def print_scaled(rec: Record, rate: dict[str, list[float]], reductions: list[int], split: Split, repeats: int) -> None:
    med = {k: statistics.median(v) for k, v in rate.items()}
    bound = med["decode bound, full size"]
    share = ", ".join(f"{100 * reductions.count(r) / len(reductions):.0f}% at 1/{r}" for r in (1, 2, 4, 8)
                      if r in reductions)
    got = med["decode bound, scaled (the loader's reductions)"] / bound
    rec.figures.update(scaled=med, reductions=share)
    rec.table("scaled", ["path", "quadruples/s", "vs full-size decode bound"],
              [[name, f"{med[name]:.1f}", f"{med[name] / bound:.2f}x"] for name in SCALED_ROWS],
              title=f"Reduced-size decoding (scaled_decode): the same quadruples on {len(split)} videos at "
                    f"{int(split.width[0])}x{int(split.height[0])} (short side 256, K400-like), crop 112, crop scales "
                    f"{tuple(LoaderConfig().crop_scale)} of the area, median of {repeats} epochs",
              notes=[f"Frames decoded: {share}. The goal, a scaled decode bound ≥ {SCALED_GOAL:.1f}x the full-size "
                     f"one: {'met' if got >= SCALED_GOAL else 'not met'} ({got:.2f}x); the loader with against "
                     f"without: {med[SCALED_ROWS[0]] / med[SCALED_ROWS[1]]:.2f}x."])


DECODES = {  # what libjpeg-turbo (simplejpeg) can be asked to do with one frame: where a decode's time goes
    "full size, RGB (the decode bound's)": {"colorspace": "RGB"},
    "1/2 (DCT scaling)": {"colorspace": "RGB", "reduce": 2},  # store.decode_jpeg's arguments (min_height, ...)
    "1/4": {"colorspace": "RGB", "reduce": 4},
    "1/8": {"colorspace": "RGB", "reduce": 8},
    "luma only": {"colorspace": "GRAY"},  # no chroma IDCT, upsampling or colour conversion
    "fast IDCT + fast upsampling": {"colorspace": "RGB", "fastdct": True, "fastupsample": True},  # less exact
}


def decode_table(splits: dict[str, Split], repeats: int, frames: int = 200) -> dict[str, dict[str, float]]:
    """Microseconds per frame of each :data:`DECODES` variant on ``frames`` frames of each split (payloads in memory,
    CPU time, best of ``repeats``): how much of a decode each option leaves. Entropy (Huffman) decoding is the part
    no option skips."""
    import simplejpeg

    out: dict[str, dict[str, float]] = {}
    for label, split in splits.items():
        jpegs = []
        for i in range(len(split)):
            payload, fo = split.payload(i, verify=False), split.frame_offsets(i)
            jpegs += [bytes(payload[fo[f] : fo[f + 1]]) for f in range(0, len(fo) - 1, 7)]
        jpegs = jpegs[:frames]
        out[label] = {}
        hw = (int(split.height[0]), int(split.width[0]))
        for name, kw in DECODES.items():
            kw = dict(kw)
            if "reduce" in kw:
                h, w = reduced_hw(hw, kw["reduce"])
                kw.update(min_height=h, min_width=w, min_factor=kw.pop("reduce"))
            best = float("inf")
            for _ in range(repeats):
                t0 = clock()
                for j in jpegs:
                    simplejpeg.decode_jpeg(j, **kw)
                best = min(best, clock() - t0)
            out[label][name] = 1e6 * best / len(jpegs)
        out[label]["bytes per frame"] = float(np.mean([len(j) for j in jpegs]))
    return out


def print_decode(rec: Record, res: dict[str, dict[str, float]]) -> None:
    labels = list(res)
    rec.figures["one frame us"] = res
    rows = [[name, *(c for k in labels for c in (f"{res[k][name]:.1f}",
                                                  f"{res[k][next(iter(DECODES))] / res[k][name]:.2f}x"))]
            for name in DECODES]
    rows.append(["bytes per frame", *(c for k in labels for c in (f"{res[k]['bytes per frame']:,.0f}", ""))])
    rec.table("decode", ["one frame", *(c for k in labels for c in (f"{k} µs", "vs full"))], rows,
              title="One JPEG frame, libjpeg-turbo through simplejpeg (CPU µs per frame, best of the repeats; "
                    "speed-up against the full-size decode)")


LATENCIES = (0.0, 0.02, 0.05)  # seconds added per request (the latency rows)
GOALS = {0.0: 0.8, 0.02: 0.7}  # whole epochs vs local disk; none at 50 ms


def _sources(small: Path, stack: contextlib.ExitStack) -> list[tuple[str, str | Path, Callable[[], None], Any, list]]:
    """(row name, dataset location, what to do before an epoch, what counts the sample bytes sent or None, server
    processes whose CPU is counted: the server's, then the latency proxy's when it has its own) for
    local disk, moto's S3 API (plain, + 20 and 50 ms by the proxy in this process) and, when nginx is on PATH,
    nginx over http:// (plain, then through a latency proxy in its own process at 0, 20 and 50 ms)."""
    from s3server import NGINX_MISSING, nginx_server, proxy_process, s3_server

    from moquad import objstore

    proxy = stack.enter_context(s3_server())
    for f in sorted(small.rglob("*")):
        if f.is_file() and "parts" not in f.parts:
            objstore.upload(f, f"s3://bkt/bench/{f.relative_to(small).as_posix()}")

    def moto(latency: float) -> Callable[[], None]:
        def setup() -> None:  # the plain row talks to moto itself: no proxy in between
            os.environ["AWS_ENDPOINT_URL"] = proxy.url if latency else f"http://127.0.0.1:{proxy.upstream}"
            proxy.latency = latency
            proxy.reset()
        return setup

    rows = [("local disk", small, lambda: None, None, [])]
    rows += [(f"S3 API (moto){_ms(lat)}", "s3://bkt/bench", moto(lat), proxy if lat else None, [proxy.server_pid])
             for lat in LATENCIES]
    try:
        nginx = stack.enter_context(nginx_server(small))
    except FileNotFoundError:
        print(NGINX_MISSING)
        return rows
    port = int(nginx.url.rsplit(":", 1)[1])
    rows.append(("http (nginx)", nginx.url, lambda: None, nginx, [nginx.pid]))
    for lat in LATENCIES:
        latency_proxy = stack.enter_context(proxy_process(port, lat))
        rows.append((f"http (nginx) via proxy{_ms(lat)}", latency_proxy.url, lambda: None, nginx,
                     [nginx.pid, latency_proxy.pid]))
    return rows


def _ms(latency: float) -> str:
    return f" + {1000 * latency:.0f} ms" if latency else ""


def _sent(server: Any) -> int:
    """Sample bytes a server sent so far: the in-process S3 proxy's count, or nginx's access log."""
    return server.ranged_bytes if isinstance(server.ranged_bytes, int) else server.ranged_bytes()


def s3_table(data: Path, cfg: LoaderConfig, repeats: int) -> dict[str, list[float]]:
    """Quadruples/s (wall clock) of whole epochs from local disk, moto's S3 API and nginx over http, with 0, 20
    and 50 ms per request, interleaved per repeat; steady state, CPU and bytes sent per byte read beside."""
    from moquad import objstore

    out: dict[str, list[float]] = collections.defaultdict(list)
    with contextlib.ExitStack() as stack:
        sources = _sources(data, stack)
        for rep in range(repeats):
            for name, where, setup, server, pids in sources:
                setup()
                objstore.reset()
                sent0 = _sent(server) if server is not None else 0
                t0, c0, s0 = time.perf_counter(), time.process_time(), [_tree_cpu(p) for p in pids]
                n = read = 0
                for b in make_loader(where, cfg, batch_size=BATCH, epoch=rep):
                    if not n:  # steady state: from the end of the epoch's first batch (no read-ahead before it)
                        t1, n1 = time.perf_counter(), len(b["video_id"])
                    n += len(b["video_id"])
                    read += b["bytes"]
                out[name].append(n / (time.perf_counter() - t0))
                out[f"steady {name}"].append((n - n1) / (time.perf_counter() - t1))
                out[f"cpu {name}"].append(time.process_time() - c0)
                for k, (pid, before) in enumerate(zip(pids, s0)):
                    out[f"{('server', 'proxy')[k]} {name}"].append(_tree_cpu(pid) - before)
                if server is not None:
                    out[f"sent {name}"].append((_sent(server) - sent0) / read)
        out["rows"] = [name for name, *_ in sources]
    return dict(out)


def _tree_cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid`` and its children (nginx's master and worker)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [pid, *map(int, kids.read_text().split())] if kids.exists() else [pid]
    return sum(_cpu_seconds(p) for p in pids)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def print_s3(rec: Record, res: dict[str, Any], repeats: int) -> None:
    rates, costs = [], []
    for name in res["rows"]:
        ratio = statistics.median(a / b for a, b in zip(res[name], res["local disk"]))
        steady = statistics.median(a / b for a, b in zip(res["steady " + name], res["steady local disk"]))
        lat = next((lat for lat in LATENCIES[1:] if name.endswith(_ms(lat))), 0.0)
        goal = f"≥ {GOALS[lat]:.1f}x: {'met' if ratio >= GOALS[lat] else 'not met'}" if lat in GOALS and \
            name not in ("local disk", "http (nginx) via proxy") else ""
        sent = f"{statistics.median(res['sent ' + name]):.3f}x" if "sent " + name in res else "–"
        server = f"{statistics.median(res.get('server ' + name, [0.0])):.2f}" + \
            (f" (+ {statistics.median(res['proxy ' + name]):.2f})" if "proxy " + name in res else "")
        rates.append([name, f"{statistics.median(res[name]):.1f}", f"{ratio:.2f}x", goal,
                      f"{statistics.median(res['steady ' + name]):.1f}", f"{steady:.2f}x"])
        costs.append([name, f"{statistics.median(res['cpu ' + name]):.2f}", server, sent])
    rec.figures["object storage"] = {k: statistics.median(v) for k, v in res.items() if k != "rows"}
    notes = []
    if "http (nginx) via proxy" in res:
        cost = statistics.median(1 - a / b for a, b in zip(res["http (nginx) via proxy"], res["http (nginx)"]))
        notes.append(f"The latency proxy's own cost (nginx through it at 0 ms against nginx direct): {100 * cost:.1f} % "
                     f"of the whole-epoch rate, {statistics.median(res['proxy http (nginx) via proxy']):.2f} CPU s per "
                     "epoch in its own process; the goals at 0 ms are read on nginx direct.")
    rec.table("s3", ["source", "whole epoch q/s", "vs local disk", "goal", "steady q/s", "vs local"], rates,
              align="lrrlrr", title=f"The loader from object storage: one process, wall clock, median of {repeats} "
                                    f"epochs of {BATCH}-video batches (sources interleaved); ratios are medians of "
                                    "per-repeat ratios", notes=notes)
    rec.table("s3_cost", ["source", "loader CPU s", "server (+ proxy) CPU s", "sent / read"], costs,
              title="CPU seconds per epoch, and the sample bytes the server sent per byte the loader counted")


def print_main(rec: Record, rate: dict[str, list[float]], frames_per_quad: list[int], split: Split,
               args: argparse.Namespace) -> None:
    med = {k: statistics.median(v) for k, v in rate.items()}
    rec.figures.update(quadruples_per_s=med, frames_per_quadruple=statistics.mean(frames_per_quad))
    rec.table("main", ["path", "quadruples/s", "clips/s", "vs PyAV", "vs decode bound"],
              [[name, f"{q:.1f}", f"{4 * q:.1f}", f"{q / med['PyAV']:.1f}x", f"{q / med['decode bound']:.2f}x"]
               for name, q in med.items()],
              title=f"MoQuad quadruples (4 x 16 frames, crop 112, dilations 1/2/4), {len(split)} K400-like videos "
                    f"({int(split.width[0])}x{int(split.height[0])}), batches of {BATCH}, one process, "
                    f"{'wall' if args.wall else 'CPU'} time, median of {args.repeats} epochs",
              notes=[f"{statistics.mean(frames_per_quad):.1f} distinct frames are decoded per quadruple; the checksum "
                     f"costs {100 * (1 - med['shards'] / med['no checksum']):.1f} % of the loader's rate."])


def print_bytes(rec: Record, rows: list[tuple]) -> None:
    rec.table("bytes", ["ranks", "batch/rank", "videos used", "their payloads MB", "read MB", "read / payloads"],
              [[world, per_rank, videos, f"{used / 1e6:.1f}", f"{read / 1e6:.1f}", f"{read / used:.3f}x"]
               for world, per_rank, videos, used, read in rows],
              align="rrrrrr", title="Bytes read per epoch (the payloads of the videos used + RAD donor frames)")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="epochs per path (40 quadruples each)")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "moquad_bench_loader"))
    ap.add_argument("--wall", action="store_true", help="time with the wall clock instead of CPU time")
    ap.add_argument("--rows", choices=("all", "local", "main", "s3", "scaled"), default="all",
                    help="local: all but the object-storage table; main: the first table; s3 / scaled: that table")
    add_argument(ap, "bench_loader")
    args = ap.parse_args(argv)
    rec = Record("bench_loader", None if argv is None else [__file__, *argv])
    global clock
    if args.wall:
        clock = time.perf_counter
    if not REAL.is_dir():
        sys.exit(f"real clips not found at {REAL}")
    torch.set_num_threads(1)
    cfg, result = LoaderConfig(frames=16, size=112, workers=0), {}
    data = build_dataset(Path(args.cache))
    if args.rows in ("all", "local", "main"):
        split = Split(data, "train")
        sources = {str(v): str((Path(args.cache) / "videos40" / v).resolve()) for v in split.video_id}
        rate, frames_per_quad = loader_rows(data, cfg, split, sources, args.repeats)
        print_main(rec, rate, frames_per_quad, split, args)
        result.update(quads_per_s={k: statistics.median(v) for k, v in rate.items()}, all=rate)
        result["workers"] = worker_rows(data, cfg, args.repeats)
        print_workers(rec, result["workers"], statistics.median(rate["decode bound"]), args.repeats)
        if args.rows != "main":
            result["bytes"] = bytes_table(data, cfg, split)
            print_bytes(rec, result["bytes"])
    if args.rows in ("all", "local", "scaled"):
        big = build_dataset(Path(args.cache), name="shards40k256", short_side=256)
        big_split = Split(big, "train")
        result["scaled"], reductions = scaled_rows(big, cfg, big_split, args.repeats)
        print_scaled(rec, result["scaled"], reductions, big_split, args.repeats)
        sides = {"128-px frames (the loader table's)": Split(data, "train"), "256-px frames": big_split}
        result["decode"] = decode_table(sides, max(3, args.repeats))
        print_decode(rec, result["decode"])
    if args.rows in ("all", "s3"):
        small = build_dataset(Path(args.cache), shard_size=1_000_000, name="shards40s")  # moto reads a whole object
        result["s3"] = s3_table(small, cfg, args.repeats)                                # per ranged GET: small shards
        print_s3(rec, result["s3"], args.repeats)
    rec.figures.update(config=dataclasses.asdict(cfg), batch=BATCH)
    rec.write(args.record)
    return result


if __name__ == "__main__":
    main()
