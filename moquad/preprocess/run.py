"""``moquad preprocess``: list a dataset, transcode every video, write shards and manifests.

Flow: adapter listing -> seeded shuffle per split -> ``--limit`` -> this part's share
(``videos[part::num_parts]``) -> skip what earlier runs of this part committed (resume) ->
a process pool transcodes videos (ffmpeg runs in the workers) -> the main process writes shards
in submission order -> per-part records -> ``merge`` writes the combined manifests and
``dataset.json`` once every part is done (automatically when this run finishes the last part).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from moquad import __version__
from moquad.config import PreprocessConfig, to_dict
from moquad.data.store import SCHEMA_VERSION
from moquad.errors import disk_errors
from moquad.preprocess import manifest, splits
from moquad.preprocess.datasets import Listing, Video, list_dataset
from moquad.preprocess.shards import ShardWriter
from moquad.preprocess.transcode import VideoError, transcode

# settings that may differ between runs of the same output (machine-specific, not data-defining)
_LOCAL_FIELDS = ("workers", "part", "out", "root")


def _validate(cfg: PreprocessConfig) -> None:
    if not cfg.out:
        raise ValueError("no output folder; pass --out DIR")
    if cfg.num_parts < 1 or not 0 <= cfg.part < cfg.num_parts:
        raise ValueError(f"--part {cfg.part} is outside 0..{cfg.num_parts - 1} (--num-parts {cfg.num_parts})")
    if cfg.short_side is not None and cfg.short_side != 0 and cfg.short_side < 2:
        raise ValueError(f"--short-side {cfg.short_side} is too small; use e.g. 128 (or 0 to keep the size)")
    if cfg.fps is not None and cfg.fps <= 0:
        raise ValueError(f"--fps {cfg.fps} must be positive (omit it to keep the native rate)")
    if cfg.shard_size < 1:
        raise ValueError(f"--shard-size {cfg.shard_size} must be a positive number of bytes (default 1e9)")
    if cfg.workers < 1:
        raise ValueError("--workers must be at least 1")
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError("--limit must be at least 1 (omit it to process everything)")
    if not 1 <= cfg.jpeg_quality <= 100:
        raise ValueError(f"--jpeg-quality {cfg.jpeg_quality} out of range; use 1..100")
    if cfg.split_ratios is not None and cfg.dataset != "folder":
        raise ValueError(f"--split-ratios is for folder datasets; {cfg.dataset} has official splits "
                         "(choose one with --split)")
    splits.check(tuple(cfg.split_ratios) if cfg.split_ratios is not None else None, cfg.group_by)


def list_and_split(cfg: PreprocessConfig) -> tuple[Listing, dict[str, Any]]:
    """The listing with each video's split set, and the record of how the split was made."""
    listing = list_dataset(cfg.dataset, cfg.root, cfg.split)
    if cfg.split_ratios is None:
        return listing, splits.describe(listing, cfg.dataset, cfg.split)
    return listing, splits.assign(listing, tuple(cfg.split_ratios), cfg.seed, cfg.group_by)


def plan(listing: Listing, cfg: PreprocessConfig) -> dict[str, list[Video]]:
    """This part's videos per split (found and missing), in processing order; deterministic."""
    by_split: dict[str, list[Video]] = {}
    for v in listing.videos + listing.missing:
        by_split.setdefault(v.split, []).append(v)
    out = {}
    for split in sorted(by_split):
        videos = sorted(by_split[split], key=lambda v: v.video_id)
        random.Random(f"{cfg.seed}-{split}").shuffle(videos)  # no shard holds one class
        if cfg.limit:
            videos = videos[: cfg.limit]
        out[split] = videos[cfg.part :: cfg.num_parts]
    return out


def _work(video: Video, short_side: int | None, fps: float | None, quality: int, encoder: str,
          threads: int = 0) -> tuple:
    """Worker: transcode one video -> ("ok", row, jpgs) or ("error", reason)."""
    try:
        fr = transcode(video.path, short_side, fps, quality, encoder, threads=threads)  # type: ignore[arg-type]
    except VideoError as e:
        return ("error", str(e))
    except Exception as e:  # noqa: BLE001 - a bad video never stops a run
        return ("error", f"internal error: {type(e).__name__}: {e}")
    row = {
        "video_id": video.video_id, "split": video.split, "label": video.label, "class_name": video.class_name,
        "source_path": str(video.path), "jpgs_size": len(fr.jpgs), "num_frames": fr.num_frames,
        "fps": float(np.float32(fr.fps)), "width": fr.width, "height": fr.height,
        "frame_offsets": fr.frame_offsets, "checksum": hashlib.sha256(fr.jpgs).hexdigest(),
        "xxh3": xxhash.xxh3_128_hexdigest(fr.jpgs),
    }
    return ("ok", row, fr.jpgs)


def _isolated(video: Video, args: tuple) -> tuple:
    """Re-run one video alone after the pool died; if it kills its process too, it is the culprit."""
    with ProcessPoolExecutor(1) as ex:
        try:
            return ex.submit(_work, video, *args).result()
        except BrokenProcessPool:
            return ("error", "crashed the decoder: its worker process died (corrupt file?)")


def _settings(cfg: PreprocessConfig, encoder: str) -> dict[str, Any]:
    d = {k: v for k, v in to_dict(cfg).items() if k not in _LOCAL_FIELDS}
    d["encoder"] = encoder
    return d


def _prepare(out: Path, cfg: PreprocessConfig, listing: Listing, encoder: str, split: dict[str, Any]) -> None:
    """Create the folder, or check a previous run there used the same settings (resume).

    Every setting but the machine-specific ones defines the data (``split_ratios``, ``group_by``
    and ``seed`` decide each video's split), so a change is refused; a key an older moquad did not
    write counts as its default (None).
    """
    pdir = manifest.parts_dir(out)
    settings = _settings(cfg, encoder)
    for f in sorted(pdir.glob("config-*.json")) if pdir.is_dir() else []:
        old = json.loads(f.read_text())["settings"]
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff:
            raise ValueError(f"{out} holds a run with different settings ({', '.join(diff)}); "
                             "re-run with the same settings to resume, or use a new --out")
    manifest.write_json({"settings": settings, "name": listing.name, "classes": listing.classes,
                         "config": to_dict(cfg), "split": split}, pdir / f"config-{cfg.part:03d}.json")
    with disk_errors(out):
        (pdir / f"done-{cfg.part:03d}.json").unlink(missing_ok=True)  # written again when this run ends
        (out / "shards").mkdir(parents=True, exist_ok=True)


def _resume_state(out: Path, part: int) -> tuple[dict[str, str], dict[str, int], int]:
    """Clean this part's uncommitted files; return done id -> split, next shard index per split, next error index."""
    pdir = manifest.parts_dir(out)
    recorded = {f.stem for f in pdir.glob(f"*-{part:03d}-*.parquet")}
    with disk_errors(out / "shards"):
        for tmp in (out / "shards").glob(f"*-{part:03d}-*.tmp"):
            tmp.unlink()
        for shard in (out / "shards").glob(f"*-{part:03d}-*.tar"):
            if shard.stem not in recorded:  # renamed but not recorded: redo its videos
                shard.unlink()
    ok, bad = manifest.read_records(out, part)
    done = dict(zip(bad.column("video_id").to_pylist(), bad.column("split").to_pylist()))
    done.update(zip(ok.column("video_id").to_pylist(), ok.column("split").to_pylist()))
    next_shard: dict[str, int] = {}
    next_err = 0
    for stem in recorded:
        split, _, idx = stem.rsplit("-", 2)
        if split == "errors":
            next_err = max(next_err, int(idx) + 1)
        else:
            next_shard[split] = max(next_shard.get(split, 0), int(idx) + 1)
    return done, next_shard, next_err


def _error_row(v: Video, reason: str) -> dict[str, Any]:
    return {"source_path": str(v.path) if v.path else "", "video_id": v.video_id, "split": v.split, "reason": reason}


def _progress(quiet: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} videos/s"), TextColumn("ok {task.fields[ok]} failed {task.fields[failed]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=quiet,
    )


def preprocess(cfg: PreprocessConfig, *, encoder: str = "mjpeg", quiet: bool = False,
               threads: int | None = None) -> dict[str, Any]:
    """Run (or resume) part ``cfg.part`` of a preprocessing job; returns the summary dict.

    ``encoder``: ``mjpeg`` (ffmpeg) or ``simplejpeg``; ``threads``: ffmpeg threads per video
    (default: the machine's cores shared among ``cfg.workers``).

    The summary covers this part (``"merged"`` holds the merged totals when this run finished the
    last outstanding part). Bad videos become rows in errors.parquet; they never raise.
    """
    _validate(cfg)
    t0 = time.perf_counter()
    listing, split_record = list_and_split(cfg)
    out = Path(cfg.out).expanduser()
    _prepare(out, cfg, listing, encoder, split_record)
    todo_by_split = plan(listing, cfg)
    done, next_shard, err_index = _resume_state(out, cfg.part)
    splits.check_unmoved([v for vs in todo_by_split.values() for v in vs], done, out)
    pending_errors: list[dict[str, Any]] = []
    if cfg.part == 0:
        pending_errors += [_error_row(v, reason) for v, reason in listing.duplicates if v.video_id not in done]
    work: list[Video] = []
    for videos in todo_by_split.values():
        for v in videos:
            if v.video_id in done:
                continue
            if v.path is None:
                pending_errors.append(_error_row(v, "missing: listed in the annotations but not found under ROOT"))
            else:
                work.append(v)
    writers: dict[str, ShardWriter] = {}

    def flush_errors() -> None:
        nonlocal err_index, pending_errors
        if pending_errors:
            manifest.write_error_record(out, cfg.part, err_index, pending_errors)
            err_index, pending_errors = err_index + 1, []

    def writer(split: str) -> ShardWriter:
        if split not in writers:
            writers[split] = ShardWriter(out, split, cfg.part, next_shard.get(split, 0), cfg.shard_size)
        return writers[split]

    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // cfg.workers) if cfg.workers > 1 else 0
    args = (cfg.short_side or None, cfg.fps, cfg.jpeg_quality, encoder, threads)
    pool = ProcessPoolExecutor(cfg.workers) if cfg.workers > 1 and len(work) > 1 else None
    n_ok = n_failed = 0
    inflight: deque[tuple[Video, Future | None]] = deque()
    it = iter(work)

    def submit() -> None:
        v = next(it, None)
        if v is not None:
            inflight.append((v, pool.submit(_work, v, *args)) if pool else (v, None))

    try:
        for _ in range(cfg.workers * 4 if pool else 1):  # workers fork here, before the progress thread
            submit()
        with _progress(quiet) as progress:
            task = progress.add_task(f"{listing.name} part {cfg.part}/{cfg.num_parts}", total=len(work),
                                     rate="-", ok=0, failed=0)
            start = last_log = time.perf_counter()
            while inflight:
                v, fut = inflight.popleft()
                try:
                    result = fut.result() if fut is not None else _work(v, *args)
                except BrokenProcessPool:  # a worker died (e.g. a decoder crash): isolate, then go on
                    result = _isolated(v, args)
                    pool.shutdown(wait=True, cancel_futures=True)
                    pool = ProcessPoolExecutor(cfg.workers)
                    inflight = deque((u, pool.submit(_work, u, *args)) for u, _ in inflight)
                submit()
                if result[0] == "ok":
                    w = writer(v.split)
                    before = w.index
                    w.add(result[1], result[2])
                    n_ok += 1
                    if w.index != before:  # a shard committed: record the errors seen so far too
                        flush_errors()
                else:
                    pending_errors.append(_error_row(v, result[1]))
                    n_failed += 1
                done_n = n_ok + n_failed
                now = time.perf_counter()
                rate = done_n / max(now - start, 1e-9)
                progress.update(task, advance=1, rate=f"{rate:.1f}", ok=n_ok, failed=n_failed)
                if not quiet and not progress.console.is_terminal and (now - last_log > 60 or done_n == len(work)):
                    last_log = now  # batch jobs (SLURM logs): a plain line a minute instead of a live bar
                    eta = (len(work) - done_n) / max(rate, 1e-9)
                    progress.console.print(f"{done_n}/{len(work)} videos, {rate:.1f} videos/s, ok {n_ok}, "
                                           f"failed {n_failed}, ETA {eta / 60:.1f} min")
        for w in writers.values():
            w.commit()
        flush_errors()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    names = set(split_record["videos"]) | {v.split for v in listing.videos + listing.missing}
    summary = _part_summary(out, cfg.part, names, time.perf_counter() - t0)
    manifest.write_json(summary, manifest.parts_dir(out) / f"done-{cfg.part:03d}.json")
    if all((manifest.parts_dir(out) / f"done-{p:03d}.json").is_file() for p in range(cfg.num_parts)):
        summary["merged"] = merge(out, quiet=True)
    if not quiet:
        print_summary(summary, title=f"{listing.name} -> {out}" + (f" (part {cfg.part}/{cfg.num_parts})"
                                                                     if cfg.num_parts > 1 else ""))
        if cfg.num_parts > 1 and "merged" in summary:
            print_summary(summary["merged"], title=f"all {cfg.num_parts} parts merged -> {out}")
        elif cfg.num_parts > 1:
            from rich.console import Console

            Console().print(f"part {cfg.part} done; once all {cfg.num_parts} parts finished, run "
                            f"`moquad preprocess {cfg.dataset} {cfg.root} --out {out} --merge`")
        if split_record["method"] == "none":
            print("note: every video is in the train split; retrieve, linear and finetune need a test split: "
                  "preprocess again into a new --out with --split-ratios 0.8,0.2")
    return summary


def _count(ok: pa.Table, bad: pa.Table) -> dict[str, Any]:
    splits: dict[str, dict[str, int]] = {}
    for split, nf, size in zip(ok.column("split").to_pylist(), ok.column("num_frames").to_pylist(),
                               ok.column("jpgs_size").to_pylist()):
        s = splits.setdefault(split, {"ok": 0, "failed": 0, "missing": 0, "frames": 0, "bytes": 0})
        s["ok"] += 1
        s["frames"] += nf
        s["bytes"] += size
    for split, reason in zip(bad.column("split").to_pylist(), bad.column("reason").to_pylist()):
        s = splits.setdefault(split, {"ok": 0, "failed": 0, "missing": 0, "frames": 0, "bytes": 0})
        s["missing" if reason.startswith("missing") else "failed"] += 1
    totals = {k: sum(s[k] for s in splits.values()) for k in ("ok", "failed", "missing", "frames", "bytes")}
    return {"splits": dict(sorted(splits.items())), **totals}


def _part_summary(out: Path, part: int, split_names: set[str], wall: float) -> dict[str, Any]:
    """This part's counts; ``splits_listed`` = every split of the listing (merge writes a manifest for each)."""
    ok, bad = manifest.read_records(out, part)
    shard_bytes = sum(p.stat().st_size for p in (out / "shards").glob(f"*-{part:03d}-*.tar"))
    return {"out": str(out), "part": part, **_count(ok, bad), "shard_bytes": shard_bytes,
            "wall_s": round(wall, 3), "splits_listed": sorted(split_names)}


def merge(out_dir: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Combine every part's records into manifests/{split}.parquet, errors.parquet and dataset.json."""
    out = Path(out_dir).expanduser()
    pdir = manifest.parts_dir(out)
    configs = sorted(pdir.glob("config-*.json")) if pdir.is_dir() else []
    if not configs:
        raise FileNotFoundError(f"{out} holds no preprocessing parts; run `moquad preprocess ... --out {out}` first")
    meta = json.loads(configs[0].read_text())
    num_parts = meta["settings"]["num_parts"]
    missing = [p for p in range(num_parts) if not (pdir / f"done-{p:03d}.json").is_file()]
    if missing:
        raise ValueError(f"parts {', '.join(map(str, missing))} of {num_parts} have not finished; run them "
                         f"(same settings, --part I) before merging")
    ok, bad = manifest.read_records(out)
    names: set[str] = set()
    wall = 0.0
    for p in range(num_parts):
        done = json.loads((pdir / f"done-{p:03d}.json").read_text())
        names |= set(done.get("splits_listed", []))
        wall = max(wall, done.get("wall_s", 0.0))
    names |= set(ok.column("split").to_pylist())
    for split in sorted(names):
        rows = ok.filter(pc.equal(ok.column("split"), split))
        rows = rows.sort_by([("shard", "ascending"), ("offset", "ascending")])
        manifest.write_table(rows, out / "manifests" / f"{split}.parquet")
    manifest.write_table(bad.sort_by([("split", "ascending"), ("video_id", "ascending")]),
                         out / "manifests" / "errors.parquet")
    counts = _count(ok, bad)
    cfg_dict = dict(meta["config"])
    cfg_dict.update({"part": 0, "encoder": meta["settings"]["encoder"]})
    info = {"schema_version": SCHEMA_VERSION, "name": meta["name"], "classes": meta["classes"],
            "splits": {s: counts["splits"].get(s, {}).get("ok", 0) for s in sorted(names)},
            "split": meta.get("split"), "preprocess": cfg_dict, "moquad_version": __version__,
            "counts": counts["splits"], "errors": counts["failed"], "missing": counts["missing"]}
    manifest.write_json(info, out / "dataset.json")
    shard_bytes = sum(p.stat().st_size for p in (out / "shards").glob("*.tar"))
    summary = {"out": str(out), **counts, "shard_bytes": shard_bytes, "wall_s": wall, "parts": num_parts}
    if not quiet:
        print_summary(summary, title=f"merged {num_parts} part(s) -> {out}")
    return summary


def print_summary(summary: dict[str, Any], title: str = "") -> None:
    """Rich table: per split ok / failed / missing, frames, bytes; totals and wall time."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None)
    for col in ("split", "ok", "failed", "missing", "frames", "JPEG MB"):
        table.add_column(col, justify="left" if col == "split" else "right")
    for split, s in summary["splits"].items():
        table.add_row(split, str(s["ok"]), str(s["failed"]), str(s["missing"]), str(s["frames"]),
                      f"{s['bytes'] / 1e6:.1f}")
    table.add_row("total", str(summary["ok"]), str(summary["failed"]), str(summary["missing"]),
                  str(summary["frames"]), f"{summary['bytes'] / 1e6:.1f}", style="bold")
    table.caption = f"shards {summary.get('shard_bytes', 0) / 1e6:.1f} MB, wall {summary.get('wall_s', 0):.1f} s"
    if summary["failed"] or summary["missing"]:
        where = Path(summary["out"]) / "manifests" / "errors.parquet" if summary.get("out") else "manifests/errors.parquet"
        table.caption += f"\n{summary['failed'] + summary['missing']} input(s) skipped, each with its reason in {where}"
    Console().print(table)

