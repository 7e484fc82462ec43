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
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import xxhash

from moquad import __version__, lock
from moquad.config import PreprocessConfig
from moquad.data.store import SCHEMA_VERSION
from moquad.preprocess import manifest, resume, splits
from moquad.preprocess.datasets import Listing, Video, list_dataset
from moquad.preprocess.shards import ShardWriter
from moquad.preprocess.summary import count, part_summary, print_run, print_summary
from moquad.preprocess.transcode import VideoError, transcode


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
    listing = list_dataset(cfg.dataset, cfg.root, cfg.official_split)
    if cfg.split_ratios is None:
        return listing, splits.describe(listing, cfg.dataset, cfg.official_split)
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


def _error_row(v: Video, reason: str) -> dict[str, Any]:
    return {"source_path": str(v.path) if v.path else "", "video_id": v.video_id, "split": v.split, "reason": reason}


def _todo(listing: Listing, todo_by_split: dict[str, list[Video]], done: dict[str, str],
          part: int) -> tuple[list[Video], list[dict[str, Any]]]:
    """The videos still to transcode, and the error rows known without transcoding (duplicates, missing)."""
    errors: list[dict[str, Any]] = []
    if part == 0:
        errors += [_error_row(v, reason) for v, reason in listing.duplicates if v.video_id not in done]
    work: list[Video] = []
    for videos in todo_by_split.values():
        for v in videos:
            if v.video_id in done:
                continue
            if v.path is None:
                errors.append(_error_row(v, "missing: listed in the annotations but not found under ROOT"))
            else:
                work.append(v)
    return work, errors


class _Sink:
    """Where results go: one shard writer per split (opened on first use) and the error rows not yet recorded.

    Error rows are recorded each time a shard commits and at the end, so whatever a kill -9 leaves
    is whole records only: the re-run skips exactly the videos they name and redoes the rest.
    """

    def __init__(self, out: Path, part: int, shard_size: int, next_shard: dict[str, int], err_index: int,
                 errors: list[dict[str, Any]]):
        self.out, self.part, self.shard_size, self.next_shard = out, part, shard_size, next_shard
        self.err_index, self.errors = err_index, errors
        self.writers: dict[str, ShardWriter] = {}
        self.n_ok = self.n_failed = 0

    def add(self, v: Video, result: tuple) -> None:
        """Write a transcoded video into its split's shard, or keep its error row."""
        if result[0] != "ok":
            self.errors.append(_error_row(v, result[1]))
            self.n_failed += 1
            return
        if v.split not in self.writers:
            self.writers[v.split] = ShardWriter(self.out, v.split, self.part, self.next_shard.get(v.split, 0),
                                                self.shard_size)
        w = self.writers[v.split]
        before = w.index
        w.add(result[1], result[2])
        self.n_ok += 1
        if w.index != before:  # a shard committed: record the errors seen so far too
            self.flush_errors()

    def flush_errors(self) -> None:
        if self.errors:
            manifest.write_error_record(self.out, self.part, self.err_index, self.errors)
            self.err_index, self.errors = self.err_index + 1, []

    def commit(self) -> None:
        for w in self.writers.values():
            w.commit()
        self.flush_errors()

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


class _Transcoder:
    """Transcode videos in a process pool (or inline for one worker), yielding results in submission order.

    A worker that dies (a decoder crash) breaks the whole pool: its video is re-run alone to name
    the culprit, then a fresh pool takes over the videos still in flight.
    """

    def __init__(self, work: list[Video], workers: int, args: tuple):
        self.workers, self.args, self._it = workers, args, iter(work)
        self.pool = ProcessPoolExecutor(workers) if workers > 1 and len(work) > 1 else None
        self.inflight: deque[tuple[Video, Future | None]] = deque()

    def start(self) -> None:
        """Queue the first videos; with a pool the workers fork here (call it before any thread starts)."""
        for _ in range(self.workers * 4 if self.pool else 1):
            self._submit()

    def _submit(self) -> None:
        v = next(self._it, None)
        if v is not None:
            self.inflight.append((v, self.pool.submit(_work, v, *self.args)) if self.pool else (v, None))

    def __iter__(self) -> Iterator[tuple[Video, tuple]]:
        while self.inflight:
            v, fut = self.inflight.popleft()
            try:
                result = fut.result() if fut is not None else _work(v, *self.args)
            except BrokenProcessPool:  # a worker died (e.g. a decoder crash): isolate, then go on
                result = _isolated(v, self.args)
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = ProcessPoolExecutor(self.workers)
                self.inflight = deque((u, self.pool.submit(_work, u, *self.args)) for u, _ in self.inflight)
            self._submit()
            yield v, result

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


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


def _transcode_all(jobs: _Transcoder, sink: _Sink, total: int, label: str, quiet: bool) -> None:
    """Drain ``jobs`` into ``sink`` under a live bar; batch jobs (no terminal: SLURM logs) get a plain line a minute."""
    jobs.start()  # workers fork here, before the progress thread
    with _progress(quiet) as progress:
        task = progress.add_task(label, total=total, rate="-", ok=0, failed=0)
        start = last_log = time.perf_counter()
        for v, result in jobs:
            sink.add(v, result)
            done_n = sink.n_ok + sink.n_failed
            now = time.perf_counter()
            rate = done_n / max(now - start, 1e-9)
            progress.update(task, advance=1, rate=f"{rate:.1f}", ok=sink.n_ok, failed=sink.n_failed)
            if not quiet and not progress.console.is_terminal and (now - last_log > 60 or done_n == total):
                last_log = now
                eta = (total - done_n) / max(rate, 1e-9)
                progress.console.print(f"{done_n}/{total} videos, {rate:.1f} videos/s, ok {sink.n_ok}, "
                                       f"failed {sink.n_failed}, ETA {eta / 60:.1f} min")


@lock.exclusive("preprocess")  # a second writer of this --out (and part) is refused
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
    resume.prepare(out, cfg, listing, encoder, split_record)
    todo_by_split = plan(listing, cfg)
    done, next_shard, err_index = resume.state(out, cfg.part)
    splits.check_unmoved([v for vs in todo_by_split.values() for v in vs], done, out)
    work, errors = _todo(listing, todo_by_split, done, cfg.part)
    sink = _Sink(out, cfg.part, cfg.shard_size, next_shard, err_index, errors)
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // cfg.workers) if cfg.workers > 1 else 0
    jobs = _Transcoder(work, cfg.workers, (cfg.short_side or None, cfg.fps, cfg.jpeg_quality, encoder, threads))
    try:
        _transcode_all(jobs, sink, len(work), f"{listing.name} part {cfg.part}/{cfg.num_parts}", quiet)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    finally:
        jobs.close()
    names = set(split_record["videos"]) | {v.split for v in listing.videos + listing.missing}
    summary = part_summary(out, cfg.part, names, time.perf_counter() - t0)
    manifest.write_json(summary, manifest.parts_dir(out) / f"done-{cfg.part:03d}.json")
    if all((manifest.parts_dir(out) / f"done-{p:03d}.json").is_file() for p in range(cfg.num_parts)):
        summary["merged"] = merge(out, quiet=True)
    if not quiet:
        print_run(summary, cfg, listing.name, out, split_record["method"])
    return summary


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
    counts = count(ok, bad)
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
