"""Engines that run a preprocessing plan: each writes the planned shards with ``shardplan.write_shard``.

:data:`ENGINES` is the table (``--engine``): ``local``, a process pool on this machine (also what each
job of a SLURM array runs, ``--num-parts N --part I``); ``ray``, one Ray task per shard on a Ray cluster
(``--ray-address auto``) or a local one. Both transcode with :func:`transcode_one` and give the same
bytes: the plan, not the engine, decides what goes where.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from pathlib import Path

import numpy as np
import xxhash

from moquad.config import PreprocessConfig
from moquad.errors import MoquadError, setting
from moquad.preprocess.datasets import Video
from moquad.preprocess.shardplan import ShardPlan, write_shard
from moquad.preprocess.transcode import VideoError, transcode

MISSING = "missing: listed in the annotations but not found under ROOT"


def transcode_one(video: Video, short_side: int | None, fps: float | None, quality: int, encoder: str,
          threads: int = 0) -> tuple:
    """Transcode one video -> ("ok", row, jpgs) or ("error", reason); never raises for a bad video."""
    if video.path is None:
        return ("error", MISSING)
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
            return ex.submit(transcode_one, video, *args).result()
        except BrokenProcessPool:
            return ("error", "crashed the decoder: its worker process died (corrupt file?)")


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
            self.inflight.append((v, self.pool.submit(transcode_one, v, *self.args)) if self.pool else (v, None))

    def __iter__(self) -> Iterator[tuple[Video, tuple]]:
        while self.inflight:
            v, fut = self.inflight.popleft()
            try:
                result = fut.result() if fut is not None else transcode_one(v, *self.args)
            except BrokenProcessPool:  # a worker died (e.g. a decoder crash): isolate, then go on
                result = _isolated(v, self.args)
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = ProcessPoolExecutor(self.workers)
                self.inflight = deque((u, self.pool.submit(transcode_one, u, *self.args)) for u, _ in self.inflight)
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


class _Bar:
    """A live bar (videos, rate, ok / failed); batch jobs (no terminal: SLURM logs) get a plain line a minute."""

    def __init__(self, total: int, label: str, quiet: bool):
        self.progress, self.total, self.label, self.quiet = _progress(quiet), total, label, quiet
        self.ok = self.failed = 0
        self.start = self.last_log = time.perf_counter()

    def __enter__(self) -> _Bar:
        self.progress.__enter__()
        self.task = self.progress.add_task(self.label, total=self.total, rate="-", ok=0, failed=0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def advance(self, ok: int, failed: int) -> None:
        self.ok, self.failed = self.ok + ok, self.failed + failed
        done, now = self.ok + self.failed, time.perf_counter()
        rate = done / max(now - self.start, 1e-9)
        self.progress.update(self.task, completed=done, rate=f"{rate:.1f}", ok=self.ok, failed=self.failed)
        if not self.quiet and not self.progress.console.is_terminal and (now - self.last_log > 60 or done == self.total):
            self.last_log = now
            eta = (self.total - done) / max(rate, 1e-9)
            self.progress.console.print(f"{done}/{self.total} videos, {rate:.1f} videos/s, ok {self.ok}, "
                                        f"failed {self.failed}, ETA {eta / 60:.1f} min")


def _ticking(results: Iterable[tuple[Video, tuple]], bar: _Bar) -> Iterator[tuple[Video, tuple]]:
    for v, r in results:
        bar.advance(int(r[0] == "ok"), int(r[0] != "ok"))
        yield v, r


def run_local(plans: list[ShardPlan], stage: Path, remote: str | None, cfg: PreprocessConfig, args: tuple,
              label: str, quiet: bool) -> None:
    """Transcode in a process pool (video by video, in plan order); the main process writes each shard."""
    jobs = _Transcoder([v for sp in plans for v in sp.videos], cfg.workers, args)
    jobs.start()  # workers fork here, before the progress thread
    try:
        with _Bar(sum(len(sp.videos) for sp in plans), label, quiet) as bar:
            results = iter(jobs)
            for sp in plans:
                write_shard(stage, sp, _ticking(islice(results, len(sp.videos)), bar), remote)
    finally:
        jobs.close()


def shard_task(target: str | None, sp: ShardPlan, remote: str | None, args: tuple) -> tuple[int, int]:
    """One Ray task: transcode and write shard ``sp`` into ``target`` (a shared folder), or stage it in a
    temp folder and upload it to ``remote``. Idempotent, so Ray may retry it."""
    stage = Path(target) if target is not None else Path(tempfile.mkdtemp(prefix="moquad-shard-"))
    try:
        return write_shard(stage, sp, ((v, transcode_one(v, *args)) for v in sp.videos), remote)
    finally:
        if target is None:
            shutil.rmtree(stage, ignore_errors=True)


def ray_missing() -> str:
    """The one line for the ray engine without Ray installed."""
    return f"{setting('engine', 'ray')} needs Ray: pip install 'moquad[ray]' (or use {setting('engine', 'local')})"


def run_ray(plans: list[ShardPlan], stage: Path, remote: str | None, cfg: PreprocessConfig, args: tuple,
            label: str, quiet: bool) -> None:
    """One Ray task per shard (retried by Ray on failure), on the cluster at ``cfg.ray_address`` or a local Ray
    of ``cfg.workers`` CPUs; an already initialised Ray is used as it is."""
    try:
        import ray
    except ImportError:
        raise MoquadError(ray_missing()) from None
    if not ray.is_initialized():
        ray.init(address=cfg.ray_address, num_cpus=None if cfg.ray_address else cfg.workers,
                 include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=True)(shard_task)
    one_thread = (*args[:4], 1)  # one CPU per task: ffmpeg gets one thread
    target = None if remote is not None else str(stage)
    refs = {task.remote(target, sp, remote, one_thread): sp for sp in plans}
    pending, failed = list(refs), []
    with _Bar(sum(len(sp.videos) for sp in plans), label, quiet) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                bar.advance(*ray.get(done[0]))
            except ray.exceptions.RayError as e:  # failed after Ray's retries: the others still finish
                failed.append(f"{refs[done[0]].stem} ({str(e).strip().splitlines()[-1][:200]})")
    if failed:
        raise MoquadError(f"{len(failed)} shard task(s) failed after 3 retries: {'; '.join(failed[:3])}; the other "
                          "shards are committed: re-run the same command to redo only these")


ENGINES: dict[str, Callable[..., None]] = {"local": run_local, "ray": run_ray}
