"""Loader throughput: MoQuad quadruples/s per worker process, three ways, on real K400-like clips.

1. ``shards``: the real loader (``make_loader``, workers=0 so this process does all the work of one
   DataLoader worker: tar read, JPEG decode of the clip frames, augmentation, RAD with the
   cross-shard donor pool, collation).
   ``colour_on_device``: the same with the colour jitter left to the accelerator (``normalize``).
   ``augment on device``: ``augment_on_device=True``: the worker only reads, draws the parameters
   and decodes the frames (into the batch); crop/resize/flip, colour and RAD are left to
   ``device_augment`` on the accelerator. This row is the worker-side cost, the one that has to keep
   up with the GPUs (target: >= 0.8x the decode bound).
2. ``pyav``: the SAME quadruples (same frame indices, same augmentation and RAD code) built the way
   pytorchvideo loads: open the source video, seek to each clip's start and decode to its end with
   PyAV. Its donor pool is pre-filled and never refreshed (free donors: favours PyAV).
3. ``decode bound``: only ``decode_frames`` of the distinct frames each quadruple uses (payload
   already in memory): what a loader could reach if everything but JPEG decoding were free.

Setup: the 340x256 Kinetics clips of ../shared/data/real-videos preprocessed at short side 128
(moquad.preprocess), 16-frame clips, 112 crops, dilations {1, 2, 4}, one torch thread (as in a
DataLoader worker). Times are CPU seconds of this process (``--wall`` for wall clock): on a
shared machine that is what one dedicated worker core would take. Each path is timed
``--repeats`` times, interleaved (a new epoch each time: new clips); the table shows medians and
the share of each step inside the loader. Run: ``nice python benchmarks/bench_loader.py``.

``device_augment`` is timed separately (second table): its cost per quadruple on batches of 8, run
HERE on the CPU with one thread -- in training it runs on the GPU, where it is ~1000x cheaper
than the model step; the CPU figure is only an upper bound of the work moved off the workers.

Reading the result: shards beat PyAV by ~15-20x, but a quadruple costs ~3x its bare JPEG decode,
because cropping/resizing four 16-frame clips, the colour jitter and RAD on one CPU core cost
more than decoding the ~60 small JPEGs they come from. ``colour_on_device`` moves the colour jitter
to the accelerator; ``augment_on_device`` moves all the pixel work there and reaches the decode
bound's neighbourhood (it decodes into the batch, which the bound's ``decode_frames`` stack does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import torch

from moquad.config import LoaderConfig, PreprocessConfig
from moquad.data.augment import device_augment
from moquad.data.disturb import cell_size, resize_donors
from moquad.data.donors import DonorPool
from moquad.data.frames import decode_frames
from moquad.data.pipeline import list_shards, make_loader
from moquad.data.views import render_views

# CPU seconds of this process (all its threads): on a shared machine wall time mostly measures the
# neighbours; CPU time is what one dedicated worker core would need. ``--wall`` switches back.
clock = time.process_time

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real-videos"
K400_LIKE = ["R6llTwEh07w.mp4", "SOX5yA1l24A.mp4", "WUzgd7C1pWA.mp4", "demo.mp4", "test.mp4"]


def build_dataset(cache: Path) -> Path:
    """Preprocess the K400-like clips once (short side 128) into ``cache/shards``."""
    out = cache / "shards128"
    if (out / "manifests" / "train.parquet").is_file():
        return out
    from moquad.preprocess.run import preprocess

    root = cache / "videos" / "k400"
    root.mkdir(parents=True, exist_ok=True)
    for name in K400_LIKE:
        link = root / name
        if not link.exists():
            link.symlink_to(REAL / name)
    preprocess(PreprocessConfig(dataset="folder", root=str(cache / "videos"), out=str(out), short_side=128,
                                workers=1), quiet=True)
    return out


def run_loader(
    data: Path, cfg: LoaderConfig, n: int, epoch: int, colour_on_device: bool = False, augment_on_device: bool = False,
    after_warmup=None,
) -> tuple[float, list[dict]]:
    """Seconds for ``n`` quadruples after the first (warm-up: donor pool fill), and their plans."""
    loader = make_loader(data, cfg, batch_size=1, num_batches=n + 1, epoch=epoch, debug=True,
                         colour_on_device=colour_on_device, augment_on_device=augment_on_device)
    it = iter(loader)
    next(it)
    if after_warmup is not None:
        after_warmup()
    t0 = clock()
    plans = []
    for batch in it:
        info = batch["info"][0]
        plans.append({"video_id": batch["video_id"][0], "names": batch["view_names"], "indices": info["indices"]})
    return clock() - t0, plans


def _plan(p: dict) -> list:
    return [(name, np.asarray(idx), name.startswith("ad_")) for name, idx in zip(p["names"], p["indices"])]


def pyav_clip(path: str, indices: np.ndarray) -> dict[int, np.ndarray]:
    """pytorchvideo-style: seek to the clip's first frame, decode to its last, keep the wanted ones."""
    wanted = set(int(i) for i in indices)
    first, last = min(wanted), max(wanted)
    got: dict[int, np.ndarray] = {}
    with av.open(path, metadata_errors="replace") as container:
        stream = container.streams.video[0]
        fps, tb = float(stream.average_rate), float(stream.time_base)
        start = stream.start_time or 0
        container.seek(start + int(first / fps / tb), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            i = int(round((frame.pts - start) * tb * fps))
            if i in wanted and i not in got:
                got[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    if len(got) < len(wanted):  # rounding of timestamps: fill with the nearest decoded frame
        keys = np.array(sorted(got))
        for i in wanted - set(got):
            got[i] = got[int(keys[np.abs(keys - i).argmin()])]
    return got


def run_pyav(plans: list[dict], sources: dict[str, str], cfg: LoaderConfig, pool: DonorPool) -> float:
    rng = np.random.default_rng(0)
    t0 = clock()
    for p in plans:
        frames: dict[int, np.ndarray] = {}
        for idx in p["indices"]:  # one seek + decode per clip, as a per-clip video reader does
            frames.update(pyav_clip(sources[p["video_id"]], np.asarray(idx)))
        unique = np.array(sorted(frames))
        render_views(_plan(p), unique, np.stack([frames[i] for i in unique]), p["video_id"], cfg, rng, pool)
    return clock() - t0


def run_decode_bound(plans: list[dict], payloads: dict[str, tuple[bytes, list[int]]]) -> float:
    total = 0.0
    for p in plans:
        jpgs, offsets = payloads[p["video_id"]]
        unique = np.unique(np.concatenate([np.asarray(i) for i in p["indices"]]))
        t0 = clock()
        decode_frames(jpgs, offsets, unique)
        total += clock() - t0
    return total


def run_device_augment(data: Path, cfg: LoaderConfig, n: int, epoch: int, batch: int = 8) -> float:
    """Seconds of ``device_augment`` (here: on the CPU) for ``n`` quadruples, in batches of ``batch``."""
    loader = make_loader(data, cfg, batch_size=batch, num_batches=max(1, n // batch), epoch=epoch,
                         augment_on_device=True)
    total = 0.0
    for b in loader:
        t0 = clock()
        device_augment(b, "cpu", cfg.size)
        total += clock() - t0
    return total * n / (batch * max(1, n // batch))


def stage_shares(data: Path, cfg: LoaderConfig, n: int, augment_on_device: bool = False) -> dict[str, float]:
    """Share of loader time per step (timers wrapped around the view-building functions)."""
    from moquad.data import raw, views

    names = {"JPEG decode": ["decode_frames"], "crop+resize+flip": ["crop_resize"],
             "colour jitter": ["colour_map", "apply_colour"], "RAD (donors, mosaic, blend)": ["rad_noise", "blend"],
             "rounding to uint8": ["round_into"]}
    if augment_on_device:
        names = {"JPEG decode (into the batch)": ["decode_into"], "frame reads": ["frame_bytes"],
                 "parameters (crop, flip, colour ops, lambda, donor draw)": ["raw_params"]}
    acc = dict.fromkeys(names, 0.0)
    module = raw if augment_on_device else views  # raw: the worker side of augment_on_device
    saved = {f: getattr(module, f) for fs in names.values() for f in fs}

    def timed(key, f):
        def g(*a, **kw):
            t0 = clock()
            r = f(*a, **kw)
            acc[key] += clock() - t0
            return r
        return g

    for k, fs in names.items():
        for f in fs:
            setattr(module, f, timed(k, saved[f]))
    try:
        total = run_loader(data, cfg, n, epoch=99, augment_on_device=augment_on_device,
                           after_warmup=lambda: acc.update(dict.fromkeys(acc, 0.0)))[0]
    finally:
        for f, fn in saved.items():
            setattr(module, f, fn)
    shares = {k: v / total for k, v in acc.items()}
    shares["other (tar read, donor stream, shuffle, batching)"] = 1 - sum(shares.values())
    if augment_on_device:
        shares["other (tar headers, donor stream, shuffle, batching)"] = shares.pop(
            "other (tar read, donor stream, shuffle, batching)")
    return shares


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quads", type=int, default=30, help="quadruples per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "moquad_bench_loader"))
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--wall", action="store_true", help="time with the wall clock instead of CPU time")
    args = ap.parse_args(argv)
    global clock
    if args.wall:
        clock = time.perf_counter
    if not REAL.is_dir():
        sys.exit(f"real clips not found at {REAL}")
    torch.set_num_threads(1)
    data = build_dataset(Path(args.cache))
    cfg = LoaderConfig(frames=16, size=112, workers=0, shuffle_buffer=4, donor_pool=256)
    table = pq.read_table(Path(data) / "manifests" / "train.parquet").to_pylist()
    sources = {r["video_id"]: r["source_path"] for r in table}
    payloads = {}
    for r in table:
        with open(Path(data) / r["shard"], "rb") as f:
            f.seek(r["jpgs_offset"])
            payloads[r["video_id"]] = (f.read(r["jpgs_size"]), r["frame_offsets"])
    donor_pool = DonorPool(iter(()), cfg.donor_pool, cell_size(cfg.size, cfg.rad_k))
    for r in table:  # free, pre-filled donors for the PyAV path
        jpgs, offsets = payloads[r["video_id"]]
        idx = np.linspace(0, len(offsets) - 2, cfg.donor_pool // len(table) + 1).astype(int)
        donor_pool.add(r["video_id"], resize_donors(torch.from_numpy(decode_frames(jpgs, offsets, idx)), donor_pool.cell))

    times: dict[str, list[float]] = {"shards": [], "shards_colour_on_device": [], "shards_augment_on_device": [],
                                     "pyav": [], "decode": [], "device_augment_cpu": []}
    frames_per_quad = []
    for rep in range(args.repeats):  # the paths are interleaved so load changes hit all of them
        t, plans = run_loader(data, cfg, args.quads, epoch=rep)
        times["shards"].append(args.quads / t)
        t_dev = run_loader(data, cfg, args.quads, epoch=rep, colour_on_device=True)[0]
        times["shards_colour_on_device"].append(args.quads / t_dev)
        t_aug = run_loader(data, cfg, args.quads, epoch=rep, augment_on_device=True)[0]
        times["shards_augment_on_device"].append(args.quads / t_aug)
        times["pyav"].append(args.quads / run_pyav(plans, sources, cfg, donor_pool))
        times["decode"].append(args.quads / run_decode_bound(plans, payloads))
        frames_per_quad += [len(np.unique(np.concatenate([np.asarray(i) for i in p["indices"]]))) for p in plans]
    for rep in range(args.repeats):  # after the loader rows: its big float tensors would perturb their allocator
        times["device_augment_cpu"].append(args.quads / run_device_augment(data, cfg, args.quads, epoch=rep))
    med = {k: statistics.median(v) for k, v in times.items()}
    shape = next(iter(payloads.values()))
    h, w = decode_frames(shape[0], shape[1], [0]).shape[1:3]
    print(f"\nMoQuad quadruples (4 x 16 frames, crop 112, dilations 1/2/4), {len(table)} K400-like clips "
          f"{w}x{h} in shards, one process, {'wall' if args.wall else 'CPU'} time, "
          f"{args.repeats} repeats x {args.quads}, median; "
          f"{statistics.mean(frames_per_quad):.1f} distinct frames decoded per quadruple\n")
    rows = [("shards (make_loader)", med["shards"]),
            ("shards, colour_on_device=True", med["shards_colour_on_device"]),
            ("shards, augment on device (worker side)", med["shards_augment_on_device"]),
            ("PyAV seek+decode (pytorchvideo-style)", med["pyav"]),
            ("JPEG decode bound (frames used only)", med["decode"])]
    print(f"| {'path':<40} | {'quadruples/s':>12} | {'clips/s':>8} | {'vs PyAV':>8} | {'vs decode bound':>15} |")
    print(f"|{'-' * 42}|{'-' * 14}|{'-' * 10}|{'-' * 10}|{'-' * 17}|")
    for name, q in rows:
        print(f"| {name:<40} | {q:>12.1f} | {4 * q:>8.1f} | {q / med['pyav']:>7.1f}x | {q / med['decode']:>14.2f}x |")
    q = med["device_augment_cpu"]
    print("\ndevice_augment alone (crop+resize+flip, colour, RAD, normalise of the augment-on-device batches), "
          "batches of 8, measured here on the CPU with one thread; in training it runs on the GPU:\n")
    print(f"| {'path':<40} | {'quadruples/s':>12} | {'clips/s':>8} | {'vs PyAV':>8} | {'vs decode bound':>15} |")
    print(f"|{'-' * 42}|{'-' * 14}|{'-' * 10}|{'-' * 10}|{'-' * 17}|")
    print(f"| {'device_augment on CPU (GPU in practice)':<40} | {q:>12.1f} | {4 * q:>8.1f} | {q / med['pyav']:>7.1f}x "
          f"| {q / med['decode']:>14.2f}x |")
    shares = stage_shares(data, cfg, args.quads)
    print("\nwhere a loader quadruple's time goes (one pass, same settings): "
          + ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items()))
    shares_dev = stage_shares(data, cfg, args.quads, augment_on_device=True)
    print("with augment_on_device (worker side): "
          + ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares_dev.items()))
    result = {
        "quads_per_s": med,
        "all": times,
        "speedup_vs_pyav": med["shards"] / med["pyav"],
        "fraction_of_decode_bound": med["shards"] / med["decode"],
        "fraction_of_decode_bound_colour_on_device": med["shards_colour_on_device"] / med["decode"],
        "fraction_of_decode_bound_augment_on_device": med["shards_augment_on_device"] / med["decode"],
        "device_augment_cpu_ms_per_quad": 1e3 / med["device_augment_cpu"],
        "targets": {"speedup_vs_pyav": 15.0, "fraction_of_decode_bound": 0.8},
        "config": dataclasses.asdict(cfg),
        "shards": [Path(s).name for s in list_shards(data, "train")],
    }
    print(f"\nvs PyAV: {result['speedup_vs_pyav']:.1f}x (target >= 15x); "
          f"vs decode bound: {result['fraction_of_decode_bound']:.2f} "
          f"({result['fraction_of_decode_bound_colour_on_device']:.2f} with colour_on_device, "
          f"{result['fraction_of_decode_bound_augment_on_device']:.2f} with augment_on_device; target >= 0.8)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
