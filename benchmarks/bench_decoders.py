"""moquad's shards against the video decoders users pick in 2026 (torchcodec, decord2): the same quadruples per CPU s.

    make setup      # the lock includes the [bench] extra (torchcodec, decord2) this benchmark needs
    nice python benchmarks/bench_decoders.py [--repeats 3] [--json out.json] [--tiny]

The tables go to ``docs/results/bench_decoders.json`` (``--record``), which the decoders page renders.

Every source builds the SAME MoQuad quadruples (4 views x 16 frames, crop 112, dilations 1/2/4, the same clip
indices, crops, flips, colour and RAD parameters): the loader draws each video's ViewParams once per epoch (its
``augment_on_device`` batches: raw frames + parameters, scaled decoding off so every frame is full size), and each
source decodes those frames from the ORIGINAL video, resizes them to the shards' size and runs the same
``apply_views(quantize=True)``:

- ``shards``: moquad's real loader (``make_loader``, one process, checksum on), as bench_loader's first row;
- ``PyAV``: bench_loader's pytorchvideo-style seek + decode (its ``pyav_frames``), antialiased bilinear resize;
- ``torchcodec``: ``VideoDecoder(seek_mode="approximate", num_ffmpeg_threads=1, transforms=[Resize(hw)])``
  (the decoder's own resize, in FFmpeg's filter graph), one batched ``get_frames_at(frames)`` per quadruple;
- ``decord2``: ``VideoReader(width=, height=, num_threads=1)`` (its own resize) and one ``get_batch(frames)``;
- ``decode bound``: bench_loader's: only the JPEG decode of the distinct frames (payloads in memory).

A decoder is opened per quadruple (a Dataset's ``__getitem__`` sees one video once per epoch). Times are CPU
seconds of this process (every decoder thread included), the sources interleaved per repeat, medians. Two
video sets: bench_loader's K400-like clips (its 5 Kinetics clips, 340x256, ~10 s, ~30 fps, 8 copies each, shards
at short side 128) and the other real clips of ../shared/data/real-videos (UCF/HMDB avi, 1080p NTU, mkv ...),
2 copies each, shards at short side 128.

torchcodec needs FFmpeg's shared libraries (libavutil.so.N ...) at run time and its wheel has none. pip can still
provide them: PyAV's wheel (a moquad dependency) bundles FFmpeg 8 under mangled names; the benchmark links them
by their sonames into a temp folder and re-runs itself with LD_LIBRARY_PATH on it (no apt needed). decord2's
wheel bundles its own FFmpeg.

Also printed: the preprocessing CPU seconds of the same videos (``preprocess``, 1 worker, ffmpeg included) and
the epochs after which they are paid back; bytes read per quadruple against the JPEG bytes of the frames it
decodes, and xxh3-128 over the whole payload (today's check) against over only the frames read.
``--tiny``: 8 copies of a 1 s clip, one epoch (the test's smoke run). The frame check (one batch per set) compares
each source's frames with the shards' (PSNR: JPEG tolerance) and, at full size, with torchcodec's.
``--peers none``: only the loader with and without its checksum and the decode bound; ``--sets k400|real``: one set.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ENV = "MOQUAD_BENCH_FFMPEG"
NO_CHECK = "shards, no checksum"  # verify_checksums=False: what the payload checksum costs the loader


def pyav_ffmpeg_dir() -> Path | None:
    """A temp folder of symlinks ``libavutil.so.60`` ... -> PyAV's bundled FFmpeg (mangled names), or None."""
    import av

    libs = Path(av.__file__).resolve().parent.parent / "av.libs"
    if not libs.is_dir():
        return None
    out = Path(tempfile.gettempdir()) / f"moquad_bench_ffmpeg_{os.getuid()}"
    out.mkdir(exist_ok=True)
    for f in libs.glob("lib*-*.so.*"):  # libavutil-5809ad29.so.60.26.102 -> libavutil.so.60
        stem, ver = f.name.split("-", 1)[0], f.name.split(".so.", 1)[1].split(".")[0]
        link = out / f"{stem}.so.{ver}"
        with contextlib.suppress(FileExistsError):  # another run made it
            link.symlink_to(f)
    return out


def reexec_with_ffmpeg() -> None:
    """Run this script again with PyAV's FFmpeg on LD_LIBRARY_PATH (read by the dynamic loader at start only)."""
    import importlib.util

    if os.environ.get(ENV) or importlib.util.find_spec("torchcodec") is None:
        return
    where = pyav_ffmpeg_dir()
    if where is None:
        return
    env = {**os.environ, ENV: str(where),
           "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(where), os.environ.get("LD_LIBRARY_PATH")]))}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    reexec_with_ffmpeg()  # before the heavy imports: the second run pays for them once

import numpy as np  # noqa: E402
import torch  # noqa: E402
from benchdata import K400_LIKE, REAL, build_dataset, cpu_seconds, pyav_frames, run_decode_bound, run_loader  # noqa: E402

from moquad.config import LoaderConfig, PreprocessConfig  # noqa: E402
from moquad.data.augment import apply_views  # noqa: E402
from moquad.data.store import Split  # noqa: E402
from moquad.record import Record, add_argument  # noqa: E402

clock = time.process_time
OTHER_REAL = sorted(p.name for p in REAL.iterdir() if p.suffix in (".mp4", ".avi", ".mkv")
                    and p.name not in K400_LIKE) if REAL.is_dir() else []
TINY = ["part_0.mp4"]  # a 1 s K400-like h264 clip, 8 copies: one batch
PAPER_EPOCHS = 200  # K400 pre-training schedule of the paper (moquad.tex, Sec. 4)
PSNR_MIN = 30.0  # peer frames vs the shards' JPEG re-encodes (quality ~90 at 128 px): the tolerance of the check


def peer_status() -> dict[str, str | None]:
    """None per peer that decodes here, else the exact error line (what pip could not provide)."""
    out: dict[str, str | None] = {}
    for name, probe in (("torchcodec", _probe_torchcodec), ("decord2", _probe_decord)):
        try:
            probe()
            out[name] = None
        except Exception as e:  # noqa: BLE001 - the line goes into the table as it is
            lines = [ln for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            cause = f" ({str(e.__cause__).splitlines()[0]})" if e.__cause__ else ""
            out[name] = f"{type(e).__name__}: {lines[-1][:160]}{cause[:160]}"
    return out


def peer_versions() -> dict[str, str | None]:
    """The installed version of each decoder package (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("av", "torchcodec", "decord2"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _probe_torchcodec() -> None:
    from torchcodec.decoders import VideoDecoder

    VideoDecoder(str(REAL / K400_LIKE[0]), seek_mode="approximate").get_frames_at([0])


def _probe_decord() -> None:
    import decord

    decord.VideoReader(str(REAL / K400_LIKE[0]), num_threads=1).get_batch([0])


def torchcodec_frames(path: str, frames: np.ndarray, hw: tuple[int, int] | None) -> np.ndarray:
    """(U, h, w, 3) uint8: approximate seek, the decoder's own resize, one batched get_frames_at."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import Resize

    dec = VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1, dimension_order="NHWC",
                       transforms=[Resize(hw)] if hw else None)
    last = dec.metadata.num_frames - 1
    return dec.get_frames_at(np.minimum(frames, last).tolist()).data.numpy()


def decord_frames(path: str, frames: np.ndarray, hw: tuple[int, int] | None) -> np.ndarray:
    """(U, h, w, 3) uint8: decord's own resize, one get_batch."""
    import decord

    h, w = hw or (-1, -1)
    vr = decord.VideoReader(path, width=w, height=h, num_threads=1)
    return vr.get_batch(np.minimum(frames, len(vr) - 1).tolist()).asnumpy()


def pyav_resized(path: str, frames: np.ndarray, hw: tuple[int, int] | None) -> np.ndarray:
    """(U, h, w, 3) uint8: bench_loader's PyAV seek + decode, then an antialiased bilinear resize (ShortSideScale)."""
    got = pyav_frames(path, frames)
    x = np.stack([got[int(f)] for f in frames])
    if hw is None:
        return x
    t = torch.nn.functional.interpolate(torch.from_numpy(x).permute(0, 3, 1, 2), size=hw, mode="bilinear",
                                        antialias=True)
    return t.permute(0, 2, 3, 1).numpy()


PEERS: dict[str, Callable[[str, np.ndarray, tuple[int, int] | None], np.ndarray]] = {
    "PyAV": pyav_resized, "torchcodec": torchcodec_frames, "decord2": decord_frames}


def _distinct(info: dict) -> np.ndarray:
    return np.unique(np.concatenate([np.asarray(x) for x in info["indices"]]))  # = ViewParams.frames (sorted)


def run_peer(batches: list[dict], split: Split, sources: dict[str, str], peer: str, size: int,
             keep: bool = False) -> tuple[float, list[torch.Tensor]]:
    """CPU seconds to build every batch's quadruples from the source videos with ``peer`` (the drawn parameters
    of the loader's batches, the shards' frame sizes), and the raw frames if ``keep``."""
    row, fn, total, kept = {str(v): i for i, v in enumerate(split.video_id)}, PEERS[peer], 0.0, []
    for b in batches:
        t0 = clock()
        raw = torch.zeros_like(b["raw"])
        for k, (vid, info) in enumerate(zip(b["video_id"], b["info"])):
            i = row[vid]
            h, w = int(split.height[i]), int(split.width[i])
            x = fn(sources[vid], _distinct(info), (h, w))
            raw[k, : len(x), :h, :w] = torch.from_numpy(x)
        apply_views({**b, "raw": raw}, size, quantize=True)
        total += clock() - t0
        if keep:
            kept.append(raw)
    return total, kept


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def frame_check(batches: list[dict], split: Split, sources: dict[str, str], peers: list[str]) -> dict[str, dict]:
    """Each peer's frames of one batch against the shards' (JPEG tolerance: PSNR per video over its decoded region;
    a video matches at >= PSNR_MIN) and, at full size, against torchcodec's decode of the same indices (PyAV's
    without it; max abs difference on the first 2 videos: 0 when both return the same frames of the stream)."""
    row, out = {str(v): i for i, v in enumerate(split.video_id)}, {}
    ref = "torchcodec" if "torchcodec" in peers else "PyAV"
    for peer in peers:
        _, raws = run_peer(batches[:1], split, sources, peer, 112, keep=True)
        b, psnr, full = batches[0], {}, []
        for k, (vid, info) in enumerate(zip(b["video_id"], b["info"])):
            i, frames = row[vid], _distinct(info)
            h, w, u = int(split.height[i]), int(split.width[i]), len(frames)
            psnr[vid] = _psnr(raws[0][k, :u, :h, :w].numpy(), b["raw"][k, :u, :h, :w].numpy())
            if peer != ref and k < 2:
                diff = PEERS[peer](sources[vid], frames, None).astype(int) - PEERS[ref](sources[vid], frames, None)
                full.append(int(np.abs(diff).max()))
        out[peer] = {"psnr": psnr, "psnr_min": min(psnr.values()), "psnr_median": statistics.median(psnr.values()),
                     "matched": sum(v >= PSNR_MIN for v in psnr.values()), "videos": len(psnr),
                     "mismatched": sorted({Path(v).name.split("_", 1)[1] for v, x in psnr.items() if x < PSNR_MIN}),
                     "full_size_ref": ref, "full_size_max_abs": max(full) if full else 0}
    return out


def _rchar() -> int:
    """Bytes this process has read through read() syscalls so far (/proc/self/io)."""
    return int(Path("/proc/self/io").read_text().split("rchar:")[1].split()[0])


def bytes_and_checksum(batches: list[dict], split: Split, repeats: int = 5) -> dict[str, float]:
    """Per quadruple: bytes the loader read (payload + RAD donors), the JPEG bytes of the frames it decodes, the
    payload bytes, the bytes of one ranged read per clip (its first to last frame, ranges merged), and CPU us of
    xxh3-128 over the payload (today) vs over each decoded frame's bytes."""
    import xxhash

    row = {str(v): i for i, v in enumerate(split.video_id)}
    read = sum(int(b["bytes"]) for b in batches)
    payloads, ranges, spans = [], [], 0
    for b in batches:
        for vid, info in zip(b["video_id"], b["info"]):
            i = row[vid]
            p, fo = split.payload(i, verify=False), split.frame_offsets(i)
            payloads.append(p)
            ranges.append([memoryview(p)[fo[f] : fo[f + 1]] for f in _distinct(info).tolist()])
            covered = np.zeros(len(fo) - 1, bool)  # one ranged read per clip: its first to its last frame
            for clip in info["indices"]:
                covered[int(np.min(clip)) : int(np.max(clip)) + 1] = True
            spans += int(np.diff(fo)[covered].sum())
    whole, per_frame = [], []
    for _ in range(repeats):
        t0 = clock()
        for p in payloads:
            xxhash.xxh3_128_hexdigest(p)
        whole.append(clock() - t0)
        t0 = clock()
        for rs in ranges:
            for r in rs:
                xxhash.xxh3_128_hexdigest(r)
        per_frame.append(clock() - t0)
    n = len(payloads)
    return {"read": read / n, "payload": sum(map(len, payloads)) / n,
            "frames": sum(len(r) for rs in ranges for r in rs) / n, "clip_spans": spans / n,
            "xxh3_payload_us": 1e6 * statistics.median(whole) / n,
            "xxh3_frames_us": 1e6 * statistics.median(per_frame) / n}


def preprocess_cpu(files: list[Path], cache: Path, short_side: int = 128) -> float:
    """CPU seconds (this process + children: ffmpeg) to preprocess ``files`` once, 1 worker, into a temp folder."""
    from moquad.preprocess.run import preprocess

    work = Path(tempfile.mkdtemp(dir=cache))
    try:
        (work / "v" / "all").mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, work / "v" / "all" / f.name)
        c0 = cpu_seconds()
        preprocess(PreprocessConfig(dataset="folder", root=str(work / "v"), out=str(work / "out"),
                                    short_side=short_side, workers=1), quiet=True)
        return cpu_seconds() - c0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_set(cache: Path, name: str, files: list[str], copies: int) -> Path:
    """``files`` of the real clips, ``copies`` real copies each, preprocessed once at short side 128."""
    out = cache / name
    if (out / "manifests" / "train.parquet").is_file():
        return out
    from moquad.preprocess.run import preprocess

    root = cache / f"videos_{name}" / "all"
    root.mkdir(parents=True, exist_ok=True)
    for f in files:
        for c in range(copies):
            if not (root / f"c{c}_{f}").exists():
                shutil.copyfile(REAL / f, root / f"c{c}_{f}")  # real files: a symlink would be deduplicated
    preprocess(PreprocessConfig(dataset="folder", root=str(root.parent), out=str(out), short_side=128, workers=2),
               quiet=True)
    return out


def measure_set(data: Path, video_root: Path, peers: list[str], repeats: int, check: bool) -> dict:
    """Quadruples per CPU second of the shards, each peer and the decode bound per repeat (interleaved), the
    bytes / checksum figures and (``check``) the frame check, on one video set."""
    split, cfg = Split(data, "train"), LoaderConfig(frames=16, size=112, workers=0)
    raw_cfg = dataclasses.replace(cfg, augment_on_device=True, scaled_decode=False)
    sources = {str(v): str((video_root / v).resolve()) for v in split.video_id}
    rows = ["shards", NO_CHECK, *peers, "decode bound"]
    rate: dict[str, list[float]] = {k: [] for k in rows}
    peer_read: dict[str, list[float]] = {p: [] for p in peers}
    for rep in range(repeats):
        loaders = [("shards", cfg), (NO_CHECK, dataclasses.replace(cfg, verify_checksums=False))]
        for name, c in loaders[:: 1 if rep % 2 == 0 else -1]:  # which runs first alternates: an order effect
            t, n, _ = run_loader(data, c, rep)                    # would otherwise read as the checksum's cost
            rate[name].append(n / t)
        _, _, raw = run_loader(data, raw_cfg, rep, keep=True)  # the same parameters for every source, untimed
        for peer in peers:
            r0 = _rchar()
            rate[peer].append(n / run_peer(raw, split, sources, peer, cfg.size)[0])
            peer_read[peer].append((_rchar() - r0) / n)
        print(f"  repeat {rep}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rate.items() if v), file=sys.stderr,
              flush=True)
        rate["decode bound"].append(n / run_decode_bound(raw, split))
    out = {"videos": len(split), "quads": n, "rate": rate, "bytes": bytes_and_checksum(raw, split),
           "peer_read": {p: statistics.median(v) for p, v in peer_read.items()},
           "source_bytes": float(np.mean([os.path.getsize(s) for s in sources.values()])),
           "frames_per_quad": float(np.mean([len(_distinct(i)) for b in raw for i in b["info"]])),
           "hw": f"{int(split.width[0])}x{int(split.height[0])}"}
    if check:
        out["check"] = frame_check(raw, split, sources, peers)
    return out


def print_set(rec: Record, key: str, label: str, res: dict, prep: float | None, status: dict[str, str | None],
              repeats: int) -> None:
    med = {k: statistics.median(v) for k, v in res["rate"].items()}
    by = res["bytes"]
    rates, reads = [], []
    for name, q in med.items():
        if name in ("shards", NO_CHECK):
            read, ratio = f"{by['read'] / 1e3:,.0f} kB (payload + donors)", f"{by['read'] / by['frames']:.2f}x"
        elif name == "decode bound":
            read, ratio = f"{by['frames'] / 1e3:,.0f} kB (in memory)", "1.00x"
        else:
            read = f"{res['peer_read'][name] / 1e3:,.0f} kB (file {res['source_bytes'] / 1e3:,.0f} kB)"
            ratio = f"{res['peer_read'][name] / by['frames']:.2f}x"
        rates.append([name, f"{q:.1f}", f"{med['shards'] / q:.2f}x", f"{q / med['PyAV']:.1f}x" if "PyAV" in med else "–"])
        reads.append([name, read, ratio])
    rates += [[name, f"not measured: {why}", "–", "–"] for name, why in status.items() if why]
    per_quad = 1e6 / med["shards"]
    notes = [f"The checksum (xxh3-128) over the whole payload ({by['payload'] / 1e3:,.0f} kB) takes "
             f"{by['xxh3_payload_us']:.0f} µs per quadruple, {100 * by['xxh3_payload_us'] / per_quad:.1f} % of the "
             f"loader's {per_quad:,.0f} µs; over only the decoded frames' bytes ({by['frames'] / 1e3:,.0f} kB, "
             f"per-frame hashes) {by['xxh3_frames_us']:.0f} µs, {100 * by['xxh3_frames_us'] / per_quad:.1f} %."]
    if prep is not None:
        paid = []
        for name in med:
            if name in ("shards", NO_CHECK, "decode bound"):
                continue
            saved = 1 / med[name] - 1 / med["shards"]  # CPU s per video per epoch
            paid.append(f"against {name} after {prep / saved:.1f} epochs" if saved > 0 else f"never against {name}")
        notes.append(f"Preprocessing these videos takes {prep:.2f} CPU s per video (1 worker, ffmpeg included); it "
                     f"pays for itself {', '.join(paid)}.")
    for peer, c in res.get("check", {}).items():
        notes.append(f"Frame check, {peer} (one batch): {c['matched']} of {c['videos']} videos match the shards' JPEG "
                     f"frames (PSNR ≥ {PSNR_MIN:.0f} dB; min {c['psnr_min']:.1f}, median {c['psnr_median']:.1f} dB)"
                     + (f"; at full size it equals {c['full_size_ref']} within {c['full_size_max_abs']} levels"
                        if c["full_size_ref"] != peer else "") + ".")
    title = (f"{label}: {res['videos']} videos, {res['quads']} quadruples per epoch, {res['frames_per_quad']:.1f} "
             f"distinct frames decoded per quadruple, CPU time, median of {repeats}")
    rec.table(key, ["source", "quadruples / CPU s", "shards vs it", "vs PyAV"], rates, title=title)
    rec.table(f"{key}_bytes", ["source", "bytes read / quadruple", "read / decoded frames' bytes"], reads,
              title=f"{label}: bytes read", notes=notes)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="epochs per source")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "moquad_bench_loader"))
    ap.add_argument("--json", default=None, help="also write every figure here")
    add_argument(ap, "bench_decoders")
    ap.add_argument("--tiny", action="store_true", help="8 copies of a 1 s clip, one epoch")
    ap.add_argument("--peers", choices=("all", "none"), default="all",
                    help="none: only the shards' rows and the decode bound (the checksum's cost, quickly)")
    ap.add_argument("--sets", choices=("all", "k400", "real"), default="all",
                    help="the K400-like clips, the other real clips, or both (one process)")
    args = ap.parse_args(argv)
    if not REAL.is_dir():
        sys.exit(f"real clips not found at {REAL}")
    torch.set_num_threads(1)
    rec = Record("bench_decoders", None if argv is None else [__file__, *argv])
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    status = peer_status()
    peers = ["PyAV", *[p for p, why in status.items() if why is None]] if args.peers == "all" else []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores); "
          f"FFmpeg for torchcodec: {os.environ.get(ENV, 'the system')}"
          + (" (PyAV's bundled libraries, linked by soname)" if os.environ.get(ENV) else ""))
    sets = [("tiny", "tiny8", TINY, 8, True)] if args.tiny else \
        [("K400-like clips", None, K400_LIKE, 8, True), ("other real clips", "real2", OTHER_REAL, 2, True)]
    sets = [s for s in sets if args.sets == "all" or args.tiny or (s[1] is None) == (args.sets == "k400")]
    result: dict = {"status": status, "load_start": os.getloadavg()}
    for label, name, files, copies, check in sets:
        if name is None:
            data, videos = build_dataset(cache), cache / "videos40"
        else:
            data, videos = build_set(cache, name, files, copies), cache / f"videos_{name}"
        prep = preprocess_cpu([REAL / f for f in files], cache) / len(files)
        res = measure_set(data, videos, peers, 1 if args.tiny else args.repeats, check)
        res["preprocess_cpu_per_video"] = prep
        key = "tiny" if args.tiny else "k400" if name is None else "real"
        print_set(rec, key, label, res, prep, status, 1 if args.tiny else args.repeats)
        result[key] = res
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    rec.figures.update(status=status, peers=peer_versions())
    rec.write(args.record)
    return result


if __name__ == "__main__":
    main()
