"""Which videos go into which shard (decided before any transcoding), and THE per-shard function.

Every engine (the local process pool, a SLURM array of ``--part`` jobs, Ray tasks) writes the same
planned shards with :func:`write_shard`, so for the same input they give byte-identical shards and
manifests. The plan: per split, this part's videos (seeded order) cut into consecutive groups of at
most ``shard_size`` bytes of *source* video (a video's output size is unknown until it is transcoded;
the source size is known up front and stable, so the plan is deterministic and a re-run recomputes it).

A shard's commit point is its record ``manifests/_parts/{split}-{part:03d}-{n:06d}.parquet``: written
after the tar (and its error rows), so a shard without a record is redone whole. With an object-store
``--out`` the tar and the records are uploaded in that same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moquad import objstore
from moquad.preprocess import manifest
from moquad.preprocess.datasets import Video
from moquad.preprocess.shards import ShardWriter, shard_name


@dataclass(frozen=True)
class ShardPlan:
    """One output shard: its name parts and the videos it holds, in order."""

    split: str
    part: int
    index: int
    videos: tuple[Video, ...]

    @property
    def stem(self) -> str:
        return shard_name(self.split, self.part, self.index).removesuffix(".tar")


def _source_bytes(v: Video) -> int:
    try:
        return v.path.stat().st_size if v.path is not None else 0
    except OSError:
        return 0  # unreadable: it becomes an error row in its shard


def plan_shards(by_split: dict[str, list[Video]], part: int, shard_size: int) -> list[ShardPlan]:
    """Cut each split's videos (already in processing order) into shards of <= ``shard_size`` source bytes."""
    plans: list[ShardPlan] = []
    for split in sorted(by_split):
        group: list[Video] = []
        total = 0
        for v in by_split[split]:
            size = _source_bytes(v)
            if group and total + size > shard_size:
                plans.append(ShardPlan(split, part, sum(p.split == split for p in plans), tuple(group)))
                group, total = [], 0
            group.append(v)
            total += size
        if group:
            plans.append(ShardPlan(split, part, sum(p.split == split for p in plans), tuple(group)))
    return plans


def error_row(v: Video, reason: str) -> dict[str, Any]:
    return {"source_path": str(v.path) if v.path else "", "video_id": v.video_id, "split": v.split, "reason": reason}


def _publish(stage: Path, remote: str | None, rel: str) -> None:
    """Upload ``stage/rel`` to ``remote/rel`` (nothing for a local --out)."""
    if remote is not None:
        objstore.upload(stage / rel, str(objstore.join(remote, rel)))


def write_shard(stage: Path, sp: ShardPlan, results: Iterable[tuple[Video, tuple]],
                remote: str | None = None) -> tuple[int, int]:
    """Write shard ``sp`` from its videos' transcode results (in plan order); returns (ok, failed).

    Order: the tar (renamed whole, uploaded), its error record, then its manifest record: the commit.
    A remote shard's local copy is deleted once uploaded.
    """
    writer = ShardWriter(stage, sp.split, sp.part, sp.index, max_bytes=1 << 62)
    errors: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []

    def before_record(rel: str, _rows: list[dict[str, Any]]) -> None:
        _publish(stage, remote, rel)
        _write_errors(stage, sp, errors, remote)

    writer.before_record = before_record
    try:
        for v, result in results:
            if result[0] == "ok":
                rows.append(writer.add(result[1], result[2]))
            else:
                errors.append(error_row(v, result[1]))
        if rows:
            writer.commit()
            if remote is not None:
                (stage / writer.committed[-1]).unlink(missing_ok=True)
        else:
            _write_errors(stage, sp, errors, remote)
            manifest.write_record(stage, sp.split, sp.part, sp.index, [])
    except BaseException:
        writer.abort()
        raise
    _publish(stage, remote, f"manifests/{manifest.PARTS}/{sp.stem}.parquet")
    return len(rows), len(errors)


def _write_errors(stage: Path, sp: ShardPlan, errors: list[dict[str, Any]], remote: str | None) -> None:
    if errors:
        manifest.write_error_record(stage, sp.stem, errors)
        _publish(stage, remote, f"manifests/{manifest.PARTS}/errors-{sp.stem}.parquet")


def check_plan(plans: Sequence[ShardPlan], recorded: dict[str, set[str]], out: Any) -> None:
    """Refuse to resume when a recorded shard holds other videos than the plan gives it now (the input changed)."""
    for sp in plans:
        have = recorded.get(sp.stem)
        if have is not None and have != {v.video_id for v in sp.videos}:
            raise ValueError(f"{out}: shard {sp.stem} was written from another list of videos (files were added, "
                             "removed or resized under ROOT since the last run); use a new --out")
