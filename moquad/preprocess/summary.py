"""Counts of a preprocessing run (per split ok / failed / missing, frames, bytes) and their tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from moquad import objstore
from moquad.config import PreprocessConfig
from moquad.objstore import Location
from moquad.preprocess import manifest


def count(ok: pa.Table, bad: pa.Table) -> dict[str, Any]:
    """Per-split and total counts of manifest rows ``ok`` and error rows ``bad``."""
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


def shard_bytes(out: Location, part: int | None = None) -> int:
    """Bytes of the finished shards under ``out`` (a folder or a store URL), of one part or all."""
    tag = f"-{part:03d}-" if part is not None else ""
    return sum(size for name, size in objstore.listdir(objstore.join(out, "shards")).items()
               if name.endswith(".tar") and (part is None or tag in name))


def part_summary(stage: Path, part: int, split_names: set[str], wall: float, out: Location) -> dict[str, Any]:
    """This part's counts; ``splits_listed`` = every split of the listing (merge writes a manifest for each)."""
    ok, bad = manifest.read_records(stage, part)
    return {"out": str(out), "part": part, **count(ok, bad), "shard_bytes": shard_bytes(out, part),
            "wall_s": round(wall, 3), "splits_listed": sorted(split_names)}


def print_run(summary: dict[str, Any], cfg: PreprocessConfig, name: str, out: Location, split_method: str) -> None:
    """What a run prints at the end: its table, the merged table or how to merge, a no-test-split note."""
    print_summary(summary, title=f"{name} -> {out}" + (f" (part {cfg.part}/{cfg.num_parts})"
                                                       if cfg.num_parts > 1 else ""))
    if cfg.num_parts > 1 and "merged" in summary:
        print_summary(summary["merged"], title=f"all {cfg.num_parts} parts merged -> {out}")
    elif cfg.num_parts > 1:
        from rich.console import Console

        Console().print(f"part {cfg.part} done; once all {cfg.num_parts} parts finished, run "
                        f"`moquad preprocess {cfg.dataset} {cfg.root} --out {out} --merge`")
    if split_method == "none":
        from moquad.preprocess.splits import NO_TEST_SPLIT_FIX

        print(f"note: every video is in the train split; retrieve, linear and finetune need a test split: "
              f"{NO_TEST_SPLIT_FIX}")


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
        where = objstore.join(summary["out"], "manifests", "errors.parquet") if summary.get("out") else \
            "manifests/errors.parquet"
        table.caption += f"\n{summary['failed'] + summary['missing']} input(s) skipped, each with its reason in {where}"
    Console().print(table)
