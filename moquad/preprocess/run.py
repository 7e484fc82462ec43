"""``moquad preprocess``: list a dataset, transcode every video, write shards and manifests.

Flow: adapter listing -> seeded shuffle per split -> ``--limit`` -> this part's share
(``videos[part::num_parts]``) -> the shard plan (``shardplan``: which videos go to which shard) ->
skip the shards earlier runs committed (resume) -> an engine (``engines.ENGINES``: a local process
pool, or Ray tasks) writes the others -> ``merge`` writes the combined manifests and ``dataset.json``
once every part is done (automatically when this run finishes the last part).

``--out`` may be an object-store URL: records are kept in a local staging folder, every shard and
record is uploaded when committed, and the merged manifests and ``dataset.json`` go up last (the
commit marker of the whole dataset).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from moquad import __version__, lock, objstore
from moquad.config import PreprocessConfig
from moquad.data.store import SCHEMA_VERSION
from moquad.errors import MoquadError
from moquad.preprocess import manifest, resume, shardplan, splits
from moquad.preprocess.datasets import Listing, Video, list_dataset
from moquad.preprocess.engines import ENGINES, ray_missing
from moquad.preprocess.summary import count, part_summary, print_run, print_summary, shard_bytes


def _validate(cfg: PreprocessConfig) -> None:
    if not cfg.out:
        raise ValueError("no output folder; pass --out DIR")
    if cfg.out.startswith(("http://", "https://")):
        raise ValueError(f"--out {cfg.out}: http(s) is read-only; write to a folder, s3:// or gs://")
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
                         "(choose one with --official-split)")
    splits.check(tuple(cfg.split_ratios) if cfg.split_ratios is not None else None, cfg.group_by)
    if cfg.engine == "ray" and importlib.util.find_spec("ray") is None:  # before anything is written
        raise MoquadError(ray_missing())


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


@contextmanager
def staged(out: str) -> Iterator[tuple[Path, str | None]]:
    """(local folder to write in, remote URL or None): a URL gets a temp staging folder holding its records."""
    if not objstore.is_url(out):
        yield Path(out).expanduser(), None
        return
    stage = Path(tempfile.mkdtemp(prefix="moquad-stage-"))
    try:
        pull_parts(out, stage)
        yield stage, out.rstrip("/")
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def pull_parts(remote: str, stage: Path) -> None:
    """Copy the remote part records (``manifests/_parts/``, and ``manifests/parts/`` of an older moquad: read, never
    written again) into the staging folder."""
    for folder in (manifest.OLD_PARTS, manifest.PARTS):  # the new name wins
        for name in objstore.listdir(objstore.join(remote, "manifests", folder)):
            objstore.download(str(objstore.join(remote, "manifests", folder, name)), manifest.parts_dir(stage) / name)


def push(stage: Path, remote: str | None, rel: str) -> None:
    if remote is not None:
        objstore.upload(stage / rel, str(objstore.join(remote, rel)))


def _listing_errors(stage: Path, remote: str | None, listing: Listing, part: int) -> None:
    """Part 0 records the duplicates the listing found (idempotent: rewritten by every run)."""
    if part == 0 and listing.duplicates:
        stem = f"_listing-{part:03d}-000000"
        manifest.write_error_record(stage, stem, [shardplan.error_row(v, r) for v, r in listing.duplicates])
        push(stage, remote, f"manifests/{manifest.PARTS}/errors-{stem}.parquet")


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
    with staged(cfg.out) as (out, remote):
        resume.prepare(out, cfg, listing, encoder, split_record)
        push(out, remote, f"manifests/{manifest.PARTS}/config-{cfg.part:03d}.json")
        by_split = plan(listing, cfg)
        plans = shardplan.plan_shards(by_split, cfg.part, cfg.shard_size)
        done, recorded = resume.state(out, cfg.part)
        splits.check_unmoved([v for vs in by_split.values() for v in vs], done, cfg.out)
        shardplan.check_plan(plans, recorded, cfg.out)
        _listing_errors(out, remote, listing, cfg.part)
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // cfg.workers) if cfg.workers > 1 else 0
        args = (cfg.short_side or None, cfg.fps, cfg.jpeg_quality, encoder, threads)
        ENGINES[cfg.engine]([sp for sp in plans if sp.stem not in recorded], out, remote, cfg, args,
                            f"{listing.name} part {cfg.part}/{cfg.num_parts}", quiet)
        if remote is not None:
            pull_parts(remote, out)  # Ray tasks wrote their records only there
        _check_recorded(out, plans, cfg)
        names = set(split_record["videos"]) | {v.split for v in listing.videos + listing.missing}
        summary = part_summary(out, cfg.part, names, time.perf_counter() - t0, remote or out)
        manifest.write_json(summary, manifest.parts_dir(out) / f"done-{cfg.part:03d}.json")
        push(out, remote, f"manifests/{manifest.PARTS}/done-{cfg.part:03d}.json")
        if all((manifest.parts_dir(out) / f"done-{p:03d}.json").is_file() for p in range(cfg.num_parts)):
            summary["merged"] = _merge(out, remote, cfg.out, quiet=True)
    if not quiet:
        print_run(summary, cfg, listing.name, summary["out"], split_record["method"])
    return summary


def _check_recorded(out: Path, plans: list[shardplan.ShardPlan], cfg: PreprocessConfig) -> None:
    """Every planned shard has its record (the commit) here: Ray tasks on other nodes that wrote into an --out
    this node cannot see would otherwise lose their shards without a word."""
    pdir = manifest.parts_dir(out)
    lost = [sp.stem for sp in plans if not (pdir / f"{sp.stem}.parquet").is_file()]
    if lost:
        raise MoquadError(f"{len(lost)} of {len(plans)} planned shards have no record in {cfg.out}/manifests/{manifest.PARTS} "
                          f"after the {cfg.engine} engine finished (first: {lost[0]}): the tasks wrote where this node "
                          "cannot see; give --out a folder every node mounts, or an s3:// / gs:// URL, and re-run")


def merge(out_dir: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Combine every part's records into manifests/{split}.parquet, errors.parquet and dataset.json."""
    with staged(str(out_dir)) as (out, remote):
        return _merge(out, remote, str(out_dir), quiet=quiet)


def _merge(out: Path, remote: str | None, where: str, *, quiet: bool) -> dict[str, Any]:
    manifest.migrate_parts(out)
    pdir = manifest.parts_dir(out)
    configs = sorted(pdir.glob("config-*.json")) if pdir.is_dir() else []
    if not configs:
        raise FileNotFoundError(f"{where} holds no preprocessing parts; run `moquad preprocess ... --out {where}` first")
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
        push(out, remote, f"manifests/{split}.parquet")
    manifest.write_table(bad.sort_by([("split", "ascending"), ("video_id", "ascending")]),
                         out / "manifests" / "errors.parquet")
    push(out, remote, "manifests/errors.parquet")
    counts = count(ok, bad)
    cfg_dict = dict(meta["config"])
    cfg_dict.update({"part": 0, "encoder": meta["settings"]["encoder"]})
    info = {"schema_version": SCHEMA_VERSION, "name": meta["name"], "classes": meta["classes"],
            "splits": {s: counts["splits"].get(s, {}).get("ok", 0) for s in sorted(names)},
            "split": meta.get("split"), "preprocess": cfg_dict, "moquad_version": __version__,
            "counts": counts["splits"], "errors": counts["failed"], "missing": counts["missing"]}
    manifest.write_json(info, out / "dataset.json")
    push(out, remote, "dataset.json")  # last: the dataset's commit marker on a store
    summary = {"out": str(remote or out), **counts, "shard_bytes": shard_bytes(remote or out), "wall_s": wall,
               "parts": num_parts}
    if not quiet:
        print_summary(summary, title=f"merged {num_parts} part(s) -> {where}")
    return summary
