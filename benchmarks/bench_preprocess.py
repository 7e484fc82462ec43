"""Preprocess throughput and storage vs a bare ffmpeg decode of the same files.

    nice python benchmarks/bench_preprocess.py [--repeats 3] [--short-side 128] [--alt] [--encoders]

Rows (median of ``--repeats`` interleaved runs, every ffmpeg with ``-threads 1``). Two clocks: the wall clock
times cores (what the table showed before) and CPU seconds (this process and its children, ffmpeg and the pool's
workers included): ffmpeg >= 6 runs demuxing, decoding, filtering and encoding in threads of their own even with
``-threads 1``, so on a machine with a spare core the wall clock hides part of the work; the CPU column is the
core-time a busy node pays per video, and the goal (<= 1.10x for the whole command) is read on it.
- ``ffmpeg decode``: ``ffmpeg -threads 1 -i f -map 0:v -f null -`` over the files (the floor);
- ``ffmpeg decode + scale``: the same with the short-side scale of the transcode (``-vf scale=W:H:flags=area``):
  the floor of any scaled output, before any JPEG is made;
- ``transcode mjpeg`` / ``transcode simplejpeg``: moquad's per-video transcoding (probe, decode,
  rotate, scale, JPEG) with each encoder; ``ratio`` is its time over the bare decode's;
- ``preprocess, whole command``: listing, pool, shard writing, manifests, with 1 and ``--workers``
  workers (one ffmpeg thread each); its ratio is core-seconds over the bare decode's.
- ``engine local`` / ``engine ray``: the whole command with ``--workers`` processes vs a local Ray of
  ``--workers`` CPUs (one task per shard; ``--engine-shard-size`` source bytes per shard so there are
  several shards to run at once); Ray is started once before timing (its start-up is printed apart),
  the outputs of the two engines are compared byte for byte. Skipped when ray is not installed.
Storage: shard bytes vs source bytes, and PSNR of the stored frames against the scaled raw frames.
``--encoders`` also measures the JPEG encoders the transcode could use (CPU vs the bare decode, bytes, PSNR):
ffmpeg's mjpeg with optimal Huffman tables (the default), with the standard tables (``-huffman default``: the
same pixels, more bytes), and libjpeg-turbo (simplejpeg) fed ffmpeg's scaled YUV 4:2:0 planes (no RGB step).
``--alt`` also measures the frame-store alternative: small-GOP MPEG-4 Part 2 video per sample
(``-g 16 -bf 0``), its bytes, PSNR and the time to decode a random 16-frame clip vs JPEG frames.
The tables go to ``docs/results/bench_preprocess.json`` (``--record``), which the Benchmarks page renders.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchdata import REAL, cpu_seconds

from moquad.config import PreprocessConfig
from moquad.data.store import decode_frames
from moquad.preprocess import transcode as T
from moquad.preprocess.run import preprocess
from moquad.record import Record, add_argument

GOAL = 1.10  # the whole command's CPU core-time per video vs a bare ffmpeg decode


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bare_decode(files: list[Path], sizes: dict[Path, tuple[int, int]] | None = None) -> None:
    """ffmpeg decodes every file to nothing (``-f null``), scaled to ``sizes[file]`` (W, H) first when given."""
    for f in files:
        scale = ["-vf", f"scale={sizes[f][0]}:{sizes[f][1]}:flags=area"] if sizes else []
        subprocess.run([T.ffmpeg_exe(), "-nostdin", "-v", "error", "-threads", "1", "-i", str(f), "-map", "0:v:0",
                        *scale, "-filter_threads", "1", "-f", "null", "-"], check=True)


def raw_frames(path: Path, short_side: int, pix_fmt: str = "rgb24") -> np.ndarray:
    """The scaled frames as the transcode sees them: (N, H, W, 3) RGB, or (N, H * W * 3 // 2) YUV 4:2:0 rows."""
    info = T.probe(path)
    w, h = T.output_size(info.width, info.height, info.rotation, short_side)
    raw = T._run_ffmpeg(path, {"vf": f"scale={w}:{h}:flags=area", "an": None, "fps_mode": "passthrough",
                               "f": "rawvideo", "pix_fmt": pix_fmt}, 1)
    frames = np.frombuffer(raw, np.uint8)
    return frames.reshape(-1, h, w, 3) if pix_fmt == "rgb24" else frames.reshape(-1, h * w * 3 // 2)


def yuv_planes_jpeg(path: Path, short_side: int, quality: int = 90) -> tuple[bytes, list[int]]:
    """libjpeg-turbo (simplejpeg) encoding ffmpeg's scaled full-range YUV 4:2:0 planes: no RGB round trip."""
    import simplejpeg

    info = T.probe(path)
    w, h = T.output_size(info.width, info.height, info.rotation, short_side)
    parts, offsets = [], [0]
    for f in raw_frames(path, short_side, "yuvj420p"):
        y, u, v = f[: w * h].reshape(h, w), f[w * h : w * h * 5 // 4].reshape(h // 2, w // 2), f[w * h * 5 // 4 :]
        parts.append(simplejpeg.encode_jpeg_yuv_planes(y, u, v.reshape(h // 2, w // 2), quality=quality))
        offsets.append(offsets[-1] + len(parts[-1]))
    return b"".join(parts), offsets


def mjpeg_standard_tables(path: Path, short_side: int) -> T.Frames:
    """The default transcode with ffmpeg's standard Huffman tables (``-huffman default``) instead of optimal ones."""
    run = T._run_ffmpeg

    def standard(p: Path, out_kwargs: dict, *a: object) -> bytes:
        return run(p, {**out_kwargs, "huffman": "default"} if out_kwargs.get("c:v") == "mjpeg" else out_kwargs, *a)
    T._run_ffmpeg = standard
    try:
        return T.transcode(path, short_side, threads=1)
    finally:
        T._run_ffmpeg = run


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2)
    return float(10 * np.log10(255.0**2 / max(mse, 1e-9)))


def mpeg4_store(path: Path, short_side: int, qv: int = 3, gop: int = 16) -> bytes:
    info = T.probe(path)
    w, h = T.output_size(info.width, info.height, info.rotation, short_side)
    # timestamps rewritten to frame numbers (1/25 s each) so a frame's index is its timestamp
    return T._run_ffmpeg(path, {"vf": f"scale={w}:{h}:flags=area,settb=1/25,setpts=N", "an": None, "enc_time_base": "1/25",
                                "fps_mode": "passthrough", "map_metadata": -1, "c:v": "mpeg4", "q:v": qv, "g": gop,
                                "bf": 0, "sc_threshold": 1_000_000_000, "f": "matroska"}, 1)


def decode_clip_mpeg4(data: bytes, indices: list[int], gop: int = 16) -> np.ndarray:
    """Decode ``indices`` (sorted) of a small-GOP stream: seek to the keyframe at or before the first,
    decode forward to the last, convert to RGB only the frames asked for (fair to the codec)."""
    import av

    wanted = set(indices)
    with av.open(io.BytesIO(data), metadata_errors="replace") as c:
        s = c.streams.video[0]
        s.thread_count = 1
        c.seek(int(indices[0] // gop * gop / 25 / s.time_base), stream=s, backward=True, any_frame=False)
        out = []
        for f in c.decode(s):
            i = int(round(float(f.pts * s.time_base) * 25))
            if i in wanted:
                out.append(f.to_ndarray(format="rgb24"))
            if i >= indices[-1]:
                break
        return np.stack(out)


def start_ray(cpus: int) -> float | None:
    """Start a local Ray of ``cpus`` CPUs; seconds it took, None when ray is not installed."""
    try:
        import ray
    except ImportError:
        print("ray not installed: no engine rows (pip install -e '.[ray]')")
        return None
    t = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    return time.perf_counter() - t


def same_output(a: Path, b: Path) -> tuple[bool, int]:
    """(every shard and manifest byte-identical, number of shards); dataset.json (timings), the parts' bookkeeping
    (``manifests/_parts``: each part's config and timings, the engine's) and the writer lock (pid, start time of
    its last holder) differ by nature."""
    def outputs(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for p in root.rglob("*")
                      if p.is_file() and not {"parts", "_parts"} & set(p.parts) and not p.name.startswith(".moquad-"))

    files, other = outputs(a), outputs(b)
    same = files == other and all((a / f).read_bytes() == (b / f).read_bytes() for f in files
                                  if f.name != "dataset.json")
    return same, sum(1 for f in files if f.suffix == ".tar")


def print_engines(rec: Record, times: dict[str, list[float]], cpus: int, n_shards: int, identical: bool,
                  ray_start: float, videos: int) -> None:
    ray, local = times[f"engine ray ({cpus} CPUs)"], times[f"engine local ({cpus} CPUs)"]
    overhead = statistics.median([r / l_ - 1 for r, l_ in zip(ray, local)])
    rec.figures["ray"] = {"overhead": overhead, "identical": identical, "shards": n_shards, "ray_init_s": ray_start}
    rows = [[name, cpus, f"{statistics.median(t):.2f}", f"{videos / statistics.median(t) / cpus:.2f}"]
            for name, t in ((f"`--engine local` (process pool, {cpus} workers)", local),
                            (f"`--engine ray` (local Ray, {cpus} CPUs, a task per shard)", ray))]
    rec.table("engines", ["engine", "cores", "wall s", "videos/s per core"], rows,
              title=f"Ray vs the local process pool, {cpus} CPUs, {n_shards} shards (ray.init not included)",
              notes=[f"Ray's overhead: {100 * overhead:+.1f} % (the median of the per-repeat ratios); every shard and "
                     f"manifest byte {'identical' if identical else 'DIFFERENT'} between the engines."])


def print_alt(rec: Record, files: list[Path], frames: dict, ref: dict, jpeg_psnr: float,
              args: argparse.Namespace) -> None:
    """The frame-store alternative (``--alt``): small-GOP MPEG-4 bytes, PSNR and clip decode time vs JPEG."""
    rng = np.random.default_rng(0)
    jpeg_bytes = sum(len(f.jpgs) for f in frames.values())
    starts = [(p, float(rng.random())) for p in files for _ in range(5)]

    def clip(p: Path, u: float, d: int) -> list[int]:  # 16 frames at dilation d, random start
        n = frames[p].num_frames
        s = int(u * max(1, n - 16 * d))
        return sorted({min(s + d * k, n - 1) for k in range(16)})

    def t_clips(decode, d: int) -> float:
        return 1000 * _median_time(lambda: [decode(p, clip(p, u, d)) for p, u in starts], args.repeats) / len(starts)

    jpeg = lambda p, ix: decode_frames(frames[p].jpgs, frames[p].frame_offsets, ix)  # noqa: E731
    times = " / ".join(f"{t_clips(jpeg, d):.1f}" for d in (1, 2, 4))
    rows = [["JPEG frames (the shards')", f"{jpeg_bytes / 1e6:.1f}", "1.00x", f"{jpeg_psnr:.1f}", times]]
    for qv, gop in ((3, 16), (2, 16), (2, 8)):
        store = {p: mpeg4_store(p, args.short_side, qv, gop) for p in files}
        alt_bytes = sum(len(b) for b in store.values())
        alt_psnr = statistics.mean(
            psnr(decode_clip_mpeg4(store[p], list(range(frames[p].num_frames)), gop), ref[p]) for p in files)
        mp4 = lambda p, ix, st=store, g=gop: decode_clip_mpeg4(st[p], ix, g)  # noqa: E731
        times = " / ".join(f"{t_clips(mp4, d):.1f}" for d in (1, 2, 4))
        rows.append([f"MPEG-4 Part 2, GOP {gop}, q:v {qv}", f"{alt_bytes / 1e6:.1f}", f"{alt_bytes / jpeg_bytes:.2f}x",
                     f"{alt_psnr:.1f}", times])
    rec.table("alt", ["frame store", "MB", "vs JPEG bytes", "PSNR dB", "16-frame clip decode ms, dilation 1 / 2 / 4"],
              rows, title="Small-GOP MPEG-4 as the frame store")


def print_encoders(rec: Record, files: list[Path], ref: dict, args: argparse.Namespace) -> None:
    """``--encoders``: CPU per encoder against the bare decode (interleaved repeats), bytes and PSNR."""
    encoders = {
        "ffmpeg mjpeg, optimal Huffman tables (default)": lambda p: T.transcode(p, args.short_side, threads=1),
        "ffmpeg mjpeg, standard Huffman tables": lambda p: mjpeg_standard_tables(p, args.short_side),
        "libjpeg-turbo from YUV planes, quality 90": lambda p: T.Frames(*yuv_planes_jpeg(p, args.short_side), 0, 0, 0),
    }
    cpu: dict[str, list[float]] = {"decode": [], **{k: [] for k in encoders}}
    out: dict[str, dict] = {}
    for _ in range(args.repeats):
        c = cpu_seconds()
        bare_decode(files)
        cpu["decode"].append(cpu_seconds() - c)
        for name, fn in encoders.items():
            c = cpu_seconds()
            out[name] = {p: fn(p) for p in files}
            cpu[name].append(cpu_seconds() - c)
    default = next(iter(encoders))
    rows = []
    for name in encoders:
        frames = out[name]
        mb = sum(len(f.jpgs) for f in frames.values())
        dec = {p: decode_frames(f.jpgs, f.frame_offsets, range(f.num_frames)) for p, f in frames.items()}
        same = all(np.array_equal(dec[p], decode_frames(out[default][p].jpgs, out[default][p].frame_offsets,
                                                         range(out[default][p].num_frames))) for p in files)
        r = statistics.median(a / b for a, b in zip(cpu[name], cpu["decode"]))
        rows.append([name, f"{r:.2f}x", f"{mb / sum(len(f.jpgs) for f in out[default].values()):.3f}x",
                     f"{statistics.mean(psnr(dec[p], ref[p]) for p in files):.2f}", "the default's" if same else "other"])
    rec.table("encoders", ["JPEG encoder (one core)", "CPU vs bare decode", "bytes vs default", "PSNR dB", "pixels"],
              rows, align="lrrrl", title="The JPEG encoders the transcode could use")


def measure(files: list[Path], args: argparse.Namespace) -> tuple:
    """Every step's wall times (interleaved repeats), the shard bytes, and whether Ray's output equals the pool's."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "raw"
        for p in files:
            (root / "all").mkdir(parents=True, exist_ok=True)
            (root / "all" / p.name).symlink_to(p)

        def run_all(workers: int, i=[0]) -> None:  # noqa: B006 - a fresh output folder per repeat
            i[0] += 1
            preprocess(PreprocessConfig(dataset="folder", root=str(root), out=f"{tmp}/out{i[0]}",
                                        short_side=args.short_side, workers=workers), quiet=True, threads=1)

        sizes = {p: T.output_size(i.width, i.height, i.rotation, args.short_side) for p, i in
                 ((p, T.probe(p)) for p in files)}
        steps = [("ffmpeg decode (floor)", 1, lambda: bare_decode(files)),
                 ("ffmpeg decode + scale", 1, lambda: bare_decode(files, sizes))]
        for enc in ("mjpeg", "simplejpeg"):
            steps.append((f"transcode {enc}", 1,
                          lambda e=enc: [T.transcode(p, args.short_side, encoder=e, threads=1) for p in files]))
        for w in sorted({1, args.workers}):
            steps.append((f"preprocess, whole command ({w} worker{'s' if w > 1 else ''})", w, lambda w=w: run_all(w)))
        last: dict[str, str] = {}

        def run_engine(engine: str, i=[0]) -> None:  # noqa: B006 - a fresh output folder per repeat
            i[0] += 1
            last[engine] = f"{tmp}/{engine}{i[0]}"
            preprocess(PreprocessConfig(dataset="folder", root=str(root), out=last[engine], engine=engine,
                                        short_side=args.short_side, workers=args.workers,
                                        shard_size=args.engine_shard_size), quiet=True, threads=1)

        ray_start = start_ray(args.workers)
        if ray_start is not None:
            for engine in ("local", "ray"):
                steps.append((f"engine {engine} ({args.workers} CPUs)", args.workers, lambda e=engine: run_engine(e)))
        # interleaved repeats: on a shared machine every step sees the same background load
        times: dict[str, list[float]] = {name: [] for name, _, _ in steps}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in steps}
        for _ in range(args.repeats):
            for name, _, fn in steps:
                t, c = time.perf_counter(), cpu_seconds()
                fn()
                times[name].append(time.perf_counter() - t)
                cpu[name].append(cpu_seconds() - c)
        shard_bytes = sum(p.stat().st_size for p in Path(f"{tmp}/out1/shards").glob("*.tar"))
        identical, n_shards = (same_output(Path(last["local"]), Path(last["ray"])) if ray_start is not None
                               else (False, 0))
    return steps, times, cpu, shard_bytes, identical, n_shards, ray_start


def print_table(rec: Record, steps: list, times: dict[str, list[float]], cpu: dict[str, list[float]], videos: int,
                title: str) -> None:
    """The main table: wall and CPU core-time per step against the bare decode, the goal beside the whole command."""
    floor = steps[0][0]

    def ratio(clock: dict[str, list[float]], name: str, cores: int) -> float:
        return statistics.median(a * cores / b for a, b in zip(clock[name], clock[floor]))

    rows = []
    for name, cores, _ in steps:
        if name.startswith("engine"):  # the engines' own table; Ray's workers are not this process's children
            continue
        c, r_cpu = statistics.median(cpu[name]), ratio(cpu, name, 1)
        goal = f"≤ {GOAL:.2f}x: {'met' if r_cpu <= GOAL else 'not met'}" if name.endswith("(1 worker)") else ""
        rec.figures[name] = {"wall_s": statistics.median(times[name]), "cpu_s": c, "cpu_vs_decode": r_cpu,
                             "wall_x_cores_vs_decode": ratio(times, name, cores)}
        rows.append([name, cores, f"{r_cpu:.2f}x", f"{ratio(times, name, cores):.2f}x", f"{videos / c:.2f}", goal])
    rec.table("main", ["step", "cores", "CPU vs bare decode", "wall × cores vs bare decode", "videos/s per CPU core",
                       "goal"], rows, align="lrrrrl", title=title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=Path, default=REAL)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--short-side", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--alt", action="store_true", help="also measure small-GOP MPEG-4 as the frame store")
    ap.add_argument("--encoders", action="store_true", help="also measure other JPEG encoders (CPU, bytes, PSNR)")
    ap.add_argument("--engine-shard-size", type=int, default=1_000_000, help="source bytes per shard (engine rows)")
    add_argument(ap, "bench_preprocess")
    args = ap.parse_args()
    rec = Record("bench_preprocess")
    files = sorted(p for p in args.videos.iterdir() if p.suffix.lower() in T.VIDEO_EXTENSIONS)
    if not files:
        sys.exit(f"no videos in {args.videos}")
    src_bytes = sum(p.stat().st_size for p in files)
    frames = {p: T.transcode(p, args.short_side, threads=1) for p in files}  # warm-up + reference output
    n_frames = sum(f.num_frames for f in frames.values())
    steps, times, cpu, shard_bytes, identical, n_shards, ray_start = measure(files, args)
    rec.figures.update(videos=len(files), frames=n_frames, source_mb=src_bytes / 1e6, short_side=args.short_side,
                       repeats=args.repeats)
    print_table(rec, steps, times, cpu, len(files),
                f"{len(files)} videos, {n_frames} frames, {src_bytes / 1e6:.1f} MB source, short side "
                f"{args.short_side}, median of {args.repeats} (ratios: medians of the per-repeat ratios to the bare "
                "decode of the same repeat)")

    ref = {p: raw_frames(p, args.short_side) for p in files}
    jpeg_psnr = statistics.mean(
        psnr(decode_frames(f.jpgs, f.frame_offsets, range(f.num_frames)), ref[p]) for p, f in frames.items())
    rec.figures.update(shard_mb=shard_bytes / 1e6, jpeg_psnr_db=jpeg_psnr)
    rec.table("storage", ["", "MB", "vs source bytes", "PSNR dB vs the scaled raw frames"],
              [["source videos", f"{src_bytes / 1e6:.1f}", "1.00x", ""],
               ["shards (JPEG frames)", f"{shard_bytes / 1e6:.1f}", f"{shard_bytes / src_bytes:.2f}x",
                f"{jpeg_psnr:.1f}"]], title="Storage")

    if ray_start is not None:
        print_engines(rec, times, args.workers, n_shards, identical, ray_start, len(files))

    if args.encoders:
        print_encoders(rec, files, ref, args)

    if args.alt:
        print_alt(rec, files, frames, ref, jpeg_psnr, args)
    rec.write(args.record)


if __name__ == "__main__":
    main()
