"""Kinetics size on one machine: what moquad costs at 240k and 1M videos, with the goals beside each figure.

The dataset is built cheaply: ``--samples`` real samples (tiny 32x40 flat-colour JPEG frames, K400-like frame
counts: ~250 per video) written by the product's shard writer, then a manifest of ``--sizes`` videos whose rows
point at those samples (distinct video ids and K400's 400 classes, shared bytes): the manifest is full size
(1M videos: 250M frame offsets) while the disk holds ~100 MB of shards.

Loader rows (per size), each the median of ``--repeats``:
  - manifest load: ``Split`` (read the Parquet file, build the shared arrays);
  - first batch, new run: manifest load + shard check + :class:`RunLoader` + ``--workers`` workers + batch 0;
  - first batch, resume mid-epoch: the same, starting at the middle step of epoch 3 (what ``--resume`` does);
  - first batch, next epoch: the run loader's next epoch (workers kept), as the trainer starts epochs 2, 3, ...;
  - epoch plan: one epoch's permutation (``EpochPlan``);
  - per worker, ``--mem-workers`` workers after each built 2 batches: USS (private pages), PSS, and the pages
    it shares copy-on-write with the main process (RSS - USS), from /proc/PID/smaps_rollup.
Preprocessing rows: ``--merge`` of ``--parts`` part manifests holding the 240k-row manifest, and the listing of a
K400-layout folder (train.csv of ``--csv-rows`` rows, one empty .mp4 per row). Evaluation rows: the feature cache
write (Lance) of a 240k-video split and the exact search of ``--queries`` queries in it at 512-d, beside an
IVF index (build + search), with recall@10. Peak memory: the growth of this process's peak RSS, or a child's.

Batches are tiny on purpose (per-rank batch 8, 4-frame clips, 32-pixel crops): the rows measure what grows with
the dataset, not the per-batch work (``bench_loader.py`` measures that). 1M needs ~3 GB of memory. Lance's k-means warnings are silenced.
Run: ``nice python benchmarks/bench_scale.py`` (~5 min on 2 cores; ``--quick``: 50k and 240k, small search). The
tables go to ``docs/results/bench_scale.json`` (``--record``), which the Benchmarks page renders.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import simplejpeg

from moquad.config import LoaderConfig
from moquad.data.epoch_plan import EpochPlan
from moquad.data.pipeline import RunLoader, make_loader
from moquad.data.store import CHECKSUM_COLUMNS, MANIFEST_SCHEMA, Split, manifest_checksum, read_manifest
from moquad.preprocess.frames import write_frames  # the product's writer of frames made in memory
from moquad.record import Record, add_argument

CLASSES = [f"class_{c:03d}" for c in range(400)]
CFG = LoaderConfig(frames=4, size=32, dilations=(1, 2), appearance_op="rad_inter", donors_per_sample=1, rad_k=2)
PER_RANK, WORLD = 8, 8  # a node: 8 ranks x per-rank batch 8 (this process is rank 0)


# ---------------------------------------------------------------- the dataset


def real_samples(root: Path, samples: int, seed: int = 0) -> Path:
    """``samples`` real videos of K400-like length (~250 frames) made of 64 distinct tiny JPEGs."""
    rng = np.random.default_rng(seed)
    frames = []
    for c in range(64):
        img = np.full((32, 40, 3), (20 + 3 * c, 4 * (c % 60), 128), dtype=np.uint8)
        frames.append(simplejpeg.encode_jpeg(img, quality=90))
    counts = np.clip(rng.normal(255, 45, samples), 30, 300).astype(int)
    videos = ((f"real{i:05d}", [frames[(i + f) % 64] for f in range(n)], i % 400) for i, n in enumerate(counts))
    return write_frames(root / "real", videos, classes=CLASSES, videos_per_shard=100)


def scale_manifest(real: Path, out: Path, videos: int, seed: int = 0) -> Path:
    """A dataset folder of ``videos`` rows pointing at the real samples (shards linked, not copied)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifests").mkdir(exist_ok=True)
    for entry in real.iterdir():
        if entry.name not in ("manifests", "dataset.json") and not (out / entry.name).exists():
            (out / entry.name).symlink_to(entry.resolve())
    base = read_manifest(real, "train")
    rng = np.random.default_rng(seed)
    with pq.ParquetWriter(out / "manifests" / "train.parquet", MANIFEST_SCHEMA) as w:
        for a in range(0, videos, 100_000):
            n = min(100_000, videos - a)
            rows = base.take(rng.integers(0, len(base), n))
            ids = [f"{r:011x}_{(r * 7) % 290:06d}_{(r * 7) % 290 + 10:06d}" for r in range(a, a + n)]
            label = rng.integers(0, 400, n)
            for name, col in (("video_id", pa.array(ids)), ("source_path", pa.array(ids)),
                              ("label", pa.array(label, pa.int32())), ("class_name", pa.array(np.take(CLASSES, label)))):
                rows = rows.set_column(rows.schema.get_field_index(name), name, col)
            w.write_table(rows, row_group_size=100_000)
    info = json.loads((real / "dataset.json").read_text())
    info["splits"] = {"train": videos}
    (out / "dataset.json").write_text(json.dumps(info))
    return out


# ---------------------------------------------------------------- measurements


def timed(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def first_batch(data: Path, workers: int, epoch: int, start: int) -> float:
    """Seconds from nothing (a new process's state) to batch ``start`` of ``epoch``: what a (resumed) run waits."""
    t0 = time.perf_counter()
    run = RunLoader(data, CFG, batch_size=PER_RANK, world_size=WORLD, rank=0)
    next(iter(make_loader(run, CFG, batch_size=PER_RANK, world_size=WORLD, epoch=epoch, start=start)))
    return time.perf_counter() - t0


def next_epoch(run: RunLoader) -> float:
    """Seconds to the first batch of the next epoch of a run loader whose workers are already up."""
    for e in (0, 1):
        t0 = time.perf_counter()
        it = iter(make_loader(run, CFG, batch_size=PER_RANK, world_size=WORLD, epoch=e, num_batches=2))
        next(it)
        took = time.perf_counter() - t0
        list(it)
    return took


def smaps(pid: int) -> dict[str, int]:
    """kB fields of /proc/PID/smaps_rollup."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":")
        out[key] = int(value.split()[0])
    return out


def worker_memory(data: Path, workers: int) -> dict[str, float]:
    """MB per worker (median over workers) after each built two batches: USS, PSS, shared with the main process."""
    run = RunLoader(data, CFG, batch_size=PER_RANK, world_size=WORLD, rank=0)
    run.split.checksum_value  # noqa: B018  (the trainer computes it before the workers start)
    lcfg = CFG.__class__(**{**CFG.__dict__, "workers": workers})
    run = RunLoader(run.split, lcfg, batch_size=PER_RANK, world_size=WORLD, rank=0)
    it = iter(make_loader(run, lcfg, batch_size=PER_RANK, world_size=WORLD, num_batches=4 * workers))
    for _ in range(2 * workers):
        next(it)
    rows = [smaps(w.pid) for w in it._workers]
    main = smaps(os.getpid())
    list(it)

    def mb(key: str) -> float:
        return statistics.median(r[key] for r in rows) / 1024

    uss = statistics.median((r["Private_Clean"] + r["Private_Dirty"]) for r in rows) / 1024
    return {"uss": uss, "dirty": mb("Private_Dirty"), "pss": mb("Pss"), "shared": mb("Rss") - uss,
            "main_rss": main["Rss"] / 1024}


def loader_rows(real: Path, tmp: Path, videos: int, args) -> dict[str, float]:
    data = scale_manifest(real, tmp / f"n{videos}", videos)
    cold_s, split = timed(lambda: Split(data), 1)  # decodes the frame index and caches it (index_cache_dir)
    load_s, split = timed(lambda: Split(data), args.repeats)
    spe = len(split) // (PER_RANK * WORLD)
    plan_s, _ = timed(lambda: EpochPlan(videos, PER_RANK, WORLD, 0, 3), args.repeats)
    checksum_s, _ = timed(lambda: manifest_checksum(read_manifest(data, "train", CHECKSUM_COLUMNS)), args.repeats)
    del split
    pairs = [(first_batch(data, args.workers, 3, 0), first_batch(data, args.workers, 3, spe // 2))
             for _ in range(args.repeats)]  # interleaved: the box's load drifts
    fresh, resume = (statistics.median(p[k] for p in pairs) for k in (0, 1))
    warm = RunLoader(data, CFG.__class__(**{**CFG.__dict__, "workers": args.workers}), batch_size=PER_RANK,
                     world_size=WORLD, rank=0)
    nxt = statistics.median(next_epoch(warm) for _ in range(args.repeats))
    del warm
    mem = worker_memory(data, args.mem_workers)
    shutil.rmtree(data)
    return {"cold": cold_s, "load": load_s, "checksum": checksum_s, "fresh": fresh, "resume": resume, "next": nxt,
            "plan": plan_s, **mem, "steps": spe}


def _in_child(fn, *a) -> tuple[float, float, object]:
    """(seconds, peak RSS MB above the child's start, result) of ``fn(*a)`` run in a fresh (spawned) process."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_measure, (fn, *a))


def _measure(fn, *a) -> tuple[float, float, object]:
    return peak_during(fn, *a)


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_during(fn, *a) -> tuple[float, float, object]:
    """(seconds, peak RSS growth in MB sampled every 20 ms, result) of ``fn(*a)`` in this process."""
    import threading

    base, peak, done = rss_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss_mb() - base)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        out = fn(*a)
    finally:
        done.set()
        thread.join()
    return time.perf_counter() - t0, max(peak[0], rss_mb() - base), out


def merge_parts(real: Path, tmp: Path, videos: int, parts: int) -> tuple[float, float]:
    """``--merge`` of ``parts`` part manifests (one record of videos/parts rows each) of a ``videos``-row dataset."""
    from moquad.preprocess import manifest

    data = scale_manifest(real, tmp / "merge", videos)
    table = read_manifest(data, "train")
    pdir = manifest.parts_dir(data)
    pdir.mkdir(parents=True)
    step = -(-videos // parts)
    for p in range(parts):
        pq.write_table(table.slice(p * step, step), pdir / f"train-{p % 10:03d}-{p // 10:06d}.parquet")
    meta = {"settings": {"num_parts": 10, "encoder": "bench"}, "name": "k400-scale", "classes": CLASSES, "config": {}}
    for p in range(10):
        (pdir / f"config-{p:03d}.json").write_text(json.dumps(meta))
        (pdir / f"done-{p:03d}.json").write_text(json.dumps({"splits_listed": ["train"], "wall_s": 0.0}))
    del table
    took, peak, _ = _in_child(_merge, str(data))
    shutil.rmtree(data)
    return took, peak


def _merge(data: str) -> None:
    from moquad.preprocess.run import merge

    merge(data, quiet=True)


def k400_listing(tmp: Path, rows: int) -> tuple[float, float]:
    """List a K400 folder: ``train.csv`` of ``rows`` rows and one (empty) video file per row in its class folder."""
    root = tmp / "k400"
    with open(tmp / "k400.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["label", "youtube_id", "time_start", "time_end", "split"])
        for r in range(rows):
            out.writerow([CLASSES[r % 400], f"{r:011x}", r % 290, r % 290 + 10, "train"])
    (root / "annotations").mkdir(parents=True)
    shutil.move(tmp / "k400.csv", root / "annotations" / "train.csv")
    for c in CLASSES:
        (root / "train" / c).mkdir(parents=True)
    for r in range(rows):
        (root / "train" / CLASSES[r % 400] / f"{r:011x}_{r % 290:06d}_{r % 290 + 10:06d}.mp4").touch()
    took, peak, found = _in_child(_list, str(root))
    assert found == rows, found
    shutil.rmtree(root)
    return took, peak


def _list(root: str) -> int:
    from moquad.preprocess.official import list_k400

    return len(list_k400(Path(root)).videos)


def search_rows(real: Path, tmp: Path, gallery: int, queries: int, dim: int) -> dict[str, float]:
    """Feature cache write (Lance) of a ``gallery``-video split, exact search of ``queries`` queries, an IVF index."""
    import torch

    from moquad.eval.ann import lance_index, lance_partitions, lance_search, recall_at
    from moquad.eval.features import _write
    from moquad.eval.search import nearest, prepare

    torch.set_num_threads(os.cpu_count() or 1)
    data = scale_manifest(real, tmp / "eval", gallery)
    split = Split(data)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(400, dim)).astype(np.float32)
    g = (centres[split.label] + rng.normal(size=(gallery, dim)).astype(np.float32))
    q = (centres[rng.integers(0, 400, queries)] + rng.normal(size=(queries, dim)).astype(np.float32))
    out = {}
    out["cache_s"], out["cache_peak"], _ = peak_during(_write, tmp / "features.lance", split, g, {"bench": True})
    gp, qp = prepare(g, center=False), prepare(q, center=False)
    out["exact_s"], out["exact_peak"], exact = peak_during(nearest, qp, gp, 10)
    t0 = time.perf_counter()
    ds = lance_index(gp, tmp / "ivf.lance")
    out["ivf_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    approx = lance_search(ds, qp, 10, nprobes=max(1, lance_partitions(gallery) // 10))
    out["ivf_search_s"] = time.perf_counter() - t0
    out["recall10"] = recall_at(approx, exact, [10])["recall@10"]
    shutil.rmtree(data)
    return out


# ---------------------------------------------------------------- the table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="240000,1000000", help="manifest sizes (videos), comma-separated")
    p.add_argument("--samples", type=int, default=2000, help="real samples the rows point at")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="loader workers for the first-batch rows (this box: 2 cores)")
    p.add_argument("--mem-workers", type=int, default=8)
    p.add_argument("--parts", type=int, default=1000)
    p.add_argument("--merge-videos", type=int, default=240_000)
    p.add_argument("--csv-rows", type=int, default=240_000)
    p.add_argument("--gallery", type=int, default=240_000)
    p.add_argument("--queries", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--rows", default="loader,merge,listing,search")
    p.add_argument("--quick", action="store_true", help="50k and 240k videos, 200 parts, 24k x 2k search, 1 repeat")
    p.add_argument("--tmp", default=None)
    add_argument(p, "bench_scale")
    args = p.parse_args()
    rec = Record("bench_scale")
    if args.quick:
        args.sizes, args.repeats, args.parts, args.gallery, args.queries = "50000,240000", 1, 200, 24_000, 2_000
    rows = set(args.rows.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="bench_scale_", dir=args.tmp))
    os.environ["MOQUAD_CACHE"] = str(tmp / "cache")
    os.environ.setdefault("LANCE_LOG", "error")  # frame indexes: measured cold, then cached; removed at the end
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 8 workers on a 2-core box: meant
    try:
        t0 = time.perf_counter()
        real = real_samples(tmp, args.samples)
        print(f"built {args.samples} real samples in {time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.2f}")
        if "loader" in rows:
            print_loader(rec, {int(s): loader_rows(real, tmp, int(s), args) for s in args.sizes.split(",")}, args)
        other = []
        if "merge" in rows:
            took, peak = merge_parts(real, tmp, args.merge_videos, args.parts)
            other.append([f"`--merge` of {args.parts:,} part manifests ({args.merge_videos:,} videos)", f"{took:.1f} s",
                          f"+{peak:,.0f} MB"])
        if "listing" in rows:
            took, peak = k400_listing(tmp, args.csv_rows)
            other.append([f"listing a K400 folder ({args.csv_rows:,} CSV rows, the files present)", f"{took:.1f} s",
                          f"+{peak:,.0f} MB"])
        if "search" in rows:
            r = search_rows(real, tmp, args.gallery, args.queries, args.dim)
            rec.figures["search"] = r
            other += [[f"feature cache write (Lance), {args.gallery:,} videos x {args.dim}-d", f"{r['cache_s']:.1f} s",
                       f"+{r['cache_peak']:,.0f} MB"],
                      [f"exact top-10 of {args.queries:,} queries in them", f"{r['exact_s']:.1f} s",
                       f"+{r['exact_peak']:,.0f} MB"],
                      [f"IVF index build / search, recall@10 {r['recall10']:.3f}",
                       f"{r['ivf_build_s']:.1f} s / {r['ivf_search_s']:.1f} s", ""]]
        if other:
            rec.table("preprocess_eval", ["preprocessing and evaluation", "time", "peak memory"], other, align="lrr",
                      title="Preprocessing and evaluation at Kinetics size")
        rec.write(args.record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


GOALS = {  # key -> (the goal's text, whether a size's figures meet it), a size's figures as a dict
    "fresh": lambda n, r: ("≤ 2 s", r["fresh"] <= 2) if n <= 240_000 else ("≤ 5 s", r["fresh"] <= 5),
    "resume": lambda n, r: ("≤ new run", r["resume"] <= r["fresh"]),
    "uss": lambda n, r: ("≤ 50 MB", r["uss"] <= 50) if n >= 1_000_000 else ("", True),
}


def _goal(key: str, n: int, r: dict[str, float]) -> str:
    if key not in GOALS:
        return ""
    text, met = GOALS[key](n, r)
    return f"{text}: {'met' if met else 'not met'}" if text else ""


def print_loader(rec: Record, res: dict[int, dict[str, float]], args) -> None:
    sizes = sorted(res)
    rec.figures["loader"] = {str(n): r for n, r in res.items()}
    lines = [("manifest load, first ever: frame index decoded + cached (s)", "cold", "{:.2f}"),
             ("manifest load (s)", "load", "{:.2f}"), ("manifest checksum, once per run (s)", "checksum", "{:.2f}"),
             (f"first batch, new run, {args.workers} workers (s)", "fresh", "{:.2f}"),
             ("first batch, resume mid-epoch (s)", "resume", "{:.2f}"),
             ("first batch, next epoch, workers kept (s)", "next", "{:.3f}"),
             ("epoch plan (s)", "plan", "{:.3f}"),
             (f"per worker of {args.mem_workers}: USS (MB)", "uss", "{:.1f}"),
             (f"per worker of {args.mem_workers}: of it written (MB)", "dirty", "{:.1f}"),
             (f"per worker of {args.mem_workers}: PSS (MB)", "pss", "{:.1f}"),
             (f"per worker of {args.mem_workers}: shared copy-on-write (MB)", "shared", "{:.0f}"),
             ("main process RSS (MB)", "main_rss", "{:.0f}")]
    rows = [[label, *(c for n in sizes for c in (fmt.format(res[n][key]), _goal(key, n, res[n])))]
            for label, key, fmt in lines]
    rec.table("loader", ["", *(c for n in sizes for c in (f"{n:,} videos", "goal"))], rows,
              align="l" + "rl" * len(sizes), title=f"The trainer's loader as rank 0 of {WORLD} ranks x per-rank batch "
                                                    f"{PER_RANK}, medians of {args.repeats}")


if __name__ == "__main__":
    main()
