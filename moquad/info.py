"""``moquad info DIR``: what a preprocessed dataset holds, before GPU time goes into it.

:func:`report` returns plain numbers (per split: videos, classes, frames, hours, bytes, class
balance, video lengths, videos each dilation cannot fit; errors by reason); :func:`print_report`
shows them as rich tables and :func:`plot_report` draws them to one PNG. Everything is read
through ``moquad.data.store`` (``read_info``, ``read_manifest``, ``read_errors``).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moquad import objstore
from moquad.data.clip_frames import clip_span
from moquad.data.store import read_errors, read_info, read_manifest
from moquad.errors import disk_errors
from moquad.preprocess.manifest import write_json

PERCENTILES = (0, 10, 25, 50, 75, 90, 100)
SPLIT_ORDER = ("train", "val", "test")
# documented reason prefixes (docs/reference/manifest_schema.md); others are grouped by the text before ':'
REASON_KINDS = ("missing", "unreadable", "truncated", "audio-only", "no video stream", "zero frames",
                "wrong extension", "undecodable", "ffmpeg failed", "ffmpeg timed out", "ffmpeg returned",
                "duplicate", "invalid frame size", "internal error", "crashed the decoder", "corrupt JPEG")


def reason_kind(reason: str) -> str:
    """The group of an errors.parquet reason: its documented prefix, else the text before ':'."""
    for kind in REASON_KINDS:
        if reason.startswith(kind):
            return kind
    return reason.split(":", 1)[0].strip() or "unknown"


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    out = {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}
    out["mean"] = float(values.mean())
    return out


def _split_stats(data_dir: Path, split: str, classes: list[str], frames: int,
                 dilations: Sequence[int]) -> dict[str, Any]:
    table = read_manifest(data_dir, split)
    nf = np.asarray(table.column("num_frames").to_pylist(), dtype=np.int64)
    fps = np.asarray(table.column("fps").to_pylist(), dtype=np.float64)
    seconds = nf / np.where(fps > 0, fps, np.nan)
    labels = Counter(table.column("label").to_pylist())
    per_class = {c: labels.get(i, 0) for i, c in enumerate(classes)}
    smallest = min(per_class.items(), key=lambda kv: (kv[1], kv[0]), default=None)  # ties: first name
    largest = min(per_class.items(), key=lambda kv: (-kv[1], kv[0]), default=None)
    fit = {}
    for d in dilations:
        span = clip_span(frames, d)
        fit[str(d)] = {"span": span, "too_short": int((nf < span).sum())}
    fits = sum((nf >= clip_span(frames, d)).astype(int) for d in dilations)
    shards = set(table.column("shard").to_pylist())
    return {
        "videos": table.num_rows,
        "classes": sum(1 for n in per_class.values() if n > 0),
        "frames": int(nf.sum()),
        "hours": float(np.nansum(seconds) / 3600),
        "bytes": int(sum(table.column("jpgs_size").to_pylist())),
        "shard_bytes": int(sum(objstore.size(objstore.join(data_dir, s)) or 0 for s in shards)),
        "smallest_class": list(smallest) if smallest else None,
        "largest_class": list(largest) if largest else None,
        "classes_without_videos": [c for c, n in per_class.items() if n == 0],
        "per_class": per_class,
        "length_frames": _percentiles(nf.astype(np.float64)),
        "length_seconds": _percentiles(seconds[np.isfinite(seconds)]),
        "dilation_fit": fit,
        "fit_fewer_than_two": int((fits < 2).sum()),  # MoQuad needs two different dilations per video
        "_num_frames": nf.tolist(),
        "_seconds": seconds.tolist(),
    }


def report(data_dir: str | Path, frames: int, dilations: Sequence[int]) -> dict[str, Any]:
    """All the numbers of ``moquad info`` as a JSON-safe dict (keys starting with ``_`` are raw lists)."""
    data_dir = data_dir if objstore.is_url(data_dir) else Path(data_dir)
    if frames < 1 or not dilations or min(dilations) < 1:
        raise ValueError(f"--frames {frames} / --dilations {list(dilations)}: use positive numbers, e.g. "
                         "--frames 16 --dilations 1,2,4")
    info = read_info(data_dir)
    classes = list(info.get("classes", []))
    names = sorted(info.get("splits", {}), key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else 9, s))
    splits = {s: _split_stats(data_dir, s, classes, frames, dilations) for s in names}
    errors = read_errors(data_dir)
    by_kind: dict[str, dict[str, int]] = {}
    for split, reason in zip(errors.column("split").to_pylist(), errors.column("reason").to_pylist()):
        kind = by_kind.setdefault(reason_kind(reason), {})
        kind[split] = kind.get(split, 0) + 1
    totals = {k: sum(s[k] for s in splits.values()) for k in ("videos", "frames", "hours", "bytes", "shard_bytes")}
    return {"data": str(data_dir), "name": info.get("name"), "num_classes": len(classes), "split": info.get("split"),
            "frames": frames, "dilations": [int(d) for d in dilations], "splits": splits, "total": totals,
            "errors": dict(sorted(by_kind.items(), key=lambda kv: -sum(kv[1].values()))),
            "num_errors": errors.num_rows}


def public(rep: dict[str, Any]) -> dict[str, Any]:
    """The report without its raw per-video lists (what ``--json`` writes)."""
    return {**rep, "splits": {s: {k: v for k, v in st.items() if not k.startswith("_")}
                              for s, st in rep["splits"].items()}}


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.1f} min"


def _split_tables(rep: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    splits, tot = rep["splits"], rep["total"]
    t = Table(title=f"{rep['name']}: {rep['num_classes']} classes, {tot['videos']} videos ({rep['data']})")
    for col in ("split", "videos", "classes", "frames", "duration", "JPEG", "shards"):
        t.add_column(col, justify="left" if col == "split" else "right")
    for name, s in splits.items():
        t.add_row(name, str(s["videos"]), str(s["classes"]), str(s["frames"]), _duration(s["hours"]),
                  _size(s["bytes"]), _size(s["shard_bytes"]))
    t.add_row("total", str(tot["videos"]), str(rep["num_classes"]), str(tot["frames"]), _duration(tot["hours"]),
              _size(tot["bytes"]), _size(tot["shard_bytes"]), style="bold")
    sp = rep.get("split") or {}
    if sp.get("method") == "ratios":
        t.caption = (f"split drawn with --split-ratios {','.join(f'{r:g}' for r in sp['ratios'])} --seed {sp['seed']}"
                     + (f" --group-by {sp['group_by']!r}" if sp.get("group_by") else ""))
    elif sp.get("method"):
        t.caption = f"split: {sp['method']}"
    b = Table(title="class balance")
    for col in ("split", "smallest class", "largest class", "classes without videos"):
        b.add_column(col)
    for name, s in splits.items():
        small, large, empty = s["smallest_class"], s["largest_class"], s["classes_without_videos"]
        b.add_row(name, f"{small[0]} ({small[1]})" if small else "-", f"{large[0]} ({large[1]})" if large else "-",
                  f"{len(empty)}: {', '.join(empty[:3])}{', ...' if len(empty) > 3 else ''}" if empty else "0")
    return [t, b]


def _length_tables(rep: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    tables = []
    for unit in ("frames", "seconds"):
        t = Table(title=f"video length ({unit})")
        t.add_column("split")
        for q in (*(f"p{q}" for q in PERCENTILES), "mean"):
            t.add_column({"p0": "min", "p100": "max", "p50": "median"}.get(q, q), justify="right")
        for name, s in rep["splits"].items():
            vals = s[f"length_{unit}"].values()
            t.add_row(name, *(f"{v:.0f}" if unit == "frames" else f"{v:.1f}" for v in vals))
        tables.append(t)
    t = Table(title=f"videos too short for a {rep['frames']}-frame clip, per dilation d")
    t.add_column("split")
    for d in rep["dilations"]:
        t.add_column(f"d={d} (span {clip_span(rep['frames'], d)})", justify="right")
    t.add_column("fit < 2 dilations", justify="right")
    for name, s in rep["splits"].items():
        n = max(s["videos"], 1)
        t.add_row(name, *(f"{f['too_short']} ({100 * f['too_short'] / n:.0f}%)" for f in s["dilation_fit"].values()),
                  str(s["fit_fewer_than_two"]))
    return [*tables, t]


def print_report(rep: dict[str, Any]) -> None:
    """Rich tables: splits, class balance, video length, dilation fit, errors by reason."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for table in _split_tables(rep) + _length_tables(rep):
        console.print(table)
    if rep["errors"]:
        t = Table(title=f"{rep['num_errors']} input(s) not written (manifests/errors.parquet), by reason")
        t.add_column("reason")
        t.add_column("count", justify="right")
        t.add_column("per split")
        for kind, per in rep["errors"].items():
            t.add_row(kind, str(sum(per.values())), ", ".join(f"{s} {n}" for s, n in sorted(per.items())))
        console.print(t)
    else:
        console.print("no input failed (manifests/errors.parquet is empty)")


def plot_report(rep: dict[str, Any], out_png: str | Path) -> Path:
    """One PNG: length histogram, videos per class, dilation fit, errors by reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_png)
    splits = rep["splits"]
    fig, ax = plt.subplots(2, 2, figsize=(13, 8))
    lengths = [s["_seconds"] for s in splits.values()]
    if any(lengths):
        ax[0, 0].hist(lengths, bins=30, stacked=True, label=list(splits))
        ax[0, 0].legend()
    ax[0, 0].set(title="video length", xlabel="seconds", ylabel="videos")
    classes = list(next(iter(splits.values()))["per_class"]) if splits else []
    x = np.arange(len(classes))
    for i, (name, s) in enumerate(splits.items()):
        counts = [s["per_class"][c] for c in classes]
        if len(classes) <= 40:
            ax[0, 1].bar(x + i * 0.8 / len(splits), counts, width=0.8 / len(splits), label=name, align="edge")
        else:
            ax[0, 1].plot(sorted(counts, reverse=True), label=name)
    if 0 < len(classes) <= 40:
        ax[0, 1].set_xticks(x + 0.4, classes, rotation=30 if len(classes) > 8 else 0, ha="right" if len(classes) > 8
                            else "center", fontsize=8)
    ax[0, 1].set(title="videos per class" + (" (sorted)" if len(classes) > 40 else ""), ylabel="videos")
    ax[0, 1].legend()
    for i, (name, s) in enumerate(splits.items()):
        share = [100 * f["too_short"] / max(s["videos"], 1) for f in s["dilation_fit"].values()]
        ax[1, 0].bar(np.arange(len(share)) + i * 0.8 / len(splits), share, width=0.8 / len(splits), label=name,
                     align="edge")
    ax[1, 0].set_xticks(np.arange(len(rep["dilations"])) + 0.4, [f"d={d}" for d in rep["dilations"]])
    ax[1, 0].set(title=f"too short for a {rep['frames']}-frame clip", ylabel="% of videos", ylim=(0, 100))
    ax[1, 0].legend()
    kinds = list(rep["errors"])[::-1]
    if kinds:
        ax[1, 1].barh(kinds, [sum(rep["errors"][k].values()) for k in kinds])
    else:
        ax[1, 1].text(0.5, 0.5, "no input failed", ha="center", va="center", transform=ax[1, 1].transAxes)
        ax[1, 1].set(xticks=[], yticks=[])
    ax[1, 1].set(title=f"inputs not written, by reason ({rep['num_errors']})", xlabel="inputs")
    fig.suptitle(f"{rep['name']}: {rep['total']['videos']} videos, {rep['num_classes']} classes, "
                 f"{rep['total']['hours']:.2f} h")
    fig.tight_layout()
    tmp = out.with_name(out.name + ".tmp")
    with disk_errors(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            fig.savefig(tmp, dpi=100, format="png")
            os.replace(tmp, out)
        finally:
            plt.close(fig)
            tmp.unlink(missing_ok=True)
    return out


def info(data_dir: str | Path, out_png: str | Path | None = None, frames: int | None = None,
         dilations: str | Sequence[int] | None = None, json_path: str | Path | None = None) -> Path:
    """``moquad info``: print the tables, write the PNG (default ``DIR/info.png``) and optionally the JSON.

    ``frames`` / ``dilations`` default to the pre-training loader's (``LoaderConfig``).
    """
    from moquad.config import LoaderConfig

    loader = LoaderConfig()
    if isinstance(dilations, str):
        if not re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", dilations):
            raise ValueError(f"--dilations {dilations!r}: expected whole numbers separated by commas, e.g. 1,2,4")
        dilations = [int(x) for x in dilations.split(",")]
    rep = report(data_dir, frames if frames is not None else loader.frames,
                 dilations if dilations is not None else loader.dilations)
    print_report(rep)
    png = plot_report(rep, out_png if out_png is not None else objstore.local_or(data_dir, "info.png"))
    if json_path is not None:
        write_json(public(rep), json_path)
    return png
