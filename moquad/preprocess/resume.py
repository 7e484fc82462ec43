"""A part's state on disk, for resuming: its settings (a changed setting is refused) and its records.

Committed = recorded in ``manifests/_parts/``; everything else of the part (temp files, a shard
renamed but not recorded) is removed on start and its videos are done again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from moquad.config import PreprocessConfig, to_dict
from moquad.errors import disk_errors
from moquad.preprocess import manifest
from moquad.preprocess.datasets import Listing

# settings that may differ between runs of the same output (machine-specific, not data-defining)
_LOCAL_FIELDS = ("workers", "part", "out", "root", "engine", "ray_address")


def _settings(cfg: PreprocessConfig, encoder: str) -> dict[str, Any]:
    d = {k: v for k, v in to_dict(cfg).items() if k not in _LOCAL_FIELDS}
    d["encoder"] = encoder
    return d


def prepare(out: Path, cfg: PreprocessConfig, listing: Listing, encoder: str, split: dict[str, Any]) -> None:
    """Create the folder, or check a previous run there used the same settings (resume).

    Every setting but the machine-specific ones defines the data (``split_ratios``, ``group_by``
    and ``seed`` decide each video's split), so a change is refused; a key an older moquad did not
    write counts as its default (None).
    """
    manifest.migrate_parts(out)
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


def state(out: Path, part: int) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Clean this part's uncommitted files; return done id -> split, and recorded shard stem -> its video ids."""
    pdir = manifest.parts_dir(out)
    recorded = {f.stem for f in pdir.glob(f"*-{part:03d}-*.parquet") if not f.name.startswith("errors-")}
    with disk_errors(out / "shards"):
        for tmp in (out / "shards").glob(f"*-{part:03d}-*.tmp"):
            tmp.unlink()
        for shard in (out / "shards").glob(f"*-{part:03d}-*.tar"):
            if shard.stem not in recorded:  # renamed but not recorded: redo its videos
                shard.unlink()
    ok, bad = manifest.read_records(out, part)
    done = dict(zip(bad.column("video_id").to_pylist(), bad.column("split").to_pylist()))
    done.update(zip(ok.column("video_id").to_pylist(), ok.column("split").to_pylist()))
    videos: dict[str, set[str]] = {stem: set() for stem in recorded}
    for shard, vid in zip(ok.column("shard").to_pylist(), ok.column("video_id").to_pylist()):
        videos.setdefault(Path(shard).stem, set()).add(vid)
    for f in pdir.glob(f"errors-*-{part:03d}-*.parquet"):
        stem = f.stem.removeprefix("errors-")
        if stem in videos:
            videos[stem] |= set(pq.read_table(f, columns=["video_id"]).column("video_id").to_pylist())
    return done, videos
