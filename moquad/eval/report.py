"""Results of the evaluation stage: provenance, JSON + text tables, classification metrics.

Every result records four things so a number can be traced back: the protocol (the evaluation
settings), the splits it trained and tested on (``splits``), the checkpoint (sha256 of the file) and the
data (a checksum of the manifest rows used, ``moquad.data.store.manifest_checksum``).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from moquad import dist
from moquad.config import EvalConfig, to_dict
from moquad.data.store import Split
from moquad.eval.clips import pretrain_clip
from moquad.eval.encoders import Encoder
from moquad.io import atomic_write_bytes, atomic_write_text
from moquad.record import environment


def provenance(cfg: EvalConfig, train: Split, test: Split, encoder: Encoder | None) -> dict[str, Any]:
    """The record every result carries: full eval config, the splits it trained and tested on, the encoder's name and
    sha256 (a checkpoint's: of its file), manifest checksums."""
    return {
        "config": to_dict(cfg),
        "splits": {"train": train.split, "test": test.split},
        "checkpoint": ({"path": str(Path(cfg.checkpoint).resolve()) if Path(cfg.checkpoint).exists() else
                        cfg.checkpoint, "sha256": encoder.sha256()}  # an encoder: its name
                       if encoder is not None and cfg.checkpoint else None),  # None: no name (random init)
        "data": {
            "dir": str(Path(cfg.data).resolve()),
            "manifests": {s.split: {"videos": len(s), "checksum": s.checksum_value} for s in (train, test)},
        },
    }


def clip_record(cfg: EvalConfig, encoder: Encoder | None) -> dict[str, Any]:
    """What a result records of its clip, framing and test views, and of the clip the encoder was pre-trained at."""
    trained = encoder.pretrained if encoder is not None else None
    framing = encoder.framing.short_side(cfg.size) if encoder is not None else cfg.size
    return {
        "clip": {"frames": cfg.frames, "size": cfg.size, "dilation": cfg.dilation, "short_side": framing,
                 "model_input": trained.model_input if trained else pretrain_clip(None).model_input,
                 "pretrained": dataclasses.asdict(trained) if trained else None,
                 "matches_pretraining": None if trained is None else trained.matches(cfg.frames, cfg.size,
                                                                                      cfg.dilation)},
        "views": {"clips": cfg.num_clips, "crops": cfg.crops, "per_video": cfg.num_clips * cfg.crops},
    }


def record(result: dict[str, Any], cfg: EvalConfig, encoder: Encoder | None) -> dict[str, Any]:
    """Add to ``result`` (from :func:`provenance`) the clip, framing, test views, the encoder
    (family, clip, framing, normalisation; a checkpoint's step and epoch), and the same in its ``protocol`` (the
    rows of the text table)."""
    rec = clip_record(cfg, encoder)
    result.update(rec)
    if encoder is not None:
        result.setdefault("encoder", encoder.record())
        if result.get("checkpoint") and encoder.pretrained is not None:
            result["checkpoint"].update(step=encoder.info.get("step"), epoch=encoder.info.get("epoch"))
    clip, trained = rec["clip"], rec["clip"]["pretrained"]
    rows = {"clip": f"{clip['frames']} frames x {clip['size']} px, dilation {clip['dilation']}, input "
                    f"{clip['model_input']}" + ("" if trained is None else
                    f"; pre-trained at {trained['frames']} x {trained['size']}, dilations "
                    f"{','.join(map(str, trained['dilations']))}" + ("" if clip["matches_pretraining"] else
                                                                     " (DIFFERENT)")),
            "framing": f"short side {clip['short_side']}, centre crop {clip['size']}"
                       + (f" ({encoder.framing.source})" if encoder is not None else ""),
            "test views": f"{cfg.num_clips} clip{'s' * (cfg.num_clips != 1)} x {cfg.crops} "
                          f"crop{'s' * (cfg.crops != 1)} per video"}
    if result.get("checkpoint") and result["checkpoint"].get("step") is not None:  # a moquad checkpoint's
        rows["checkpoint step"] = f"{result['checkpoint'].get('step')} (epoch {result['checkpoint'].get('epoch')})"
    result["protocol"] = {**rows, **result.get("protocol", {})}
    return result


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    return v


def write_result(result: dict[str, Any], json_path: str | Path, tables: list[Table], quiet: bool = False) -> Path:
    """Write ``result`` as JSON and the same numbers as a text table beside it (``.txt``); print the tables unless
    ``quiet``."""
    json_path = Path(json_path)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return json_path  # one writer under torchrun: every rank computed the same numbers
    result = {**result, "environment": environment()}  # the commit, the lock and the machine
    atomic_write_text(json_path, json.dumps(_jsonable(result), indent=2) + "\n")
    console = Console(record=True, width=110, file=io.StringIO() if quiet else None)
    for t in tables:
        console.print(t)
    atomic_write_text(json_path.with_suffix(".txt"), console.export_text())
    return json_path


def protocol_table(title: str, result: dict[str, Any]) -> Table:
    """Small key/value table of the provenance block (checkpoint, data, protocol)."""
    t = Table(title=title, show_header=False, min_width=len(title) + 4)
    t.add_column("key")
    t.add_column("value")
    ckpt = result["checkpoint"]
    t.add_row("checkpoint", f"{ckpt['path']} (sha256 {ckpt['sha256'][:12]})" if ckpt else "none")
    t.add_row("splits", "trained on {train}, tested on {test}".format(**result["splits"]))
    for split, m in result["data"]["manifests"].items():
        t.add_row(f"data {split}", f"{result['data']['dir']} ({m['videos']} videos, {m['checksum'][:12]})")
    for k, v in result.get("protocol", {}).items():
        t.add_row(k, str(v))
    return t


def accuracy_report(probs: np.ndarray, labels: np.ndarray, classes: list[str]) -> dict[str, Any]:
    """top-1 / top-5 accuracy, per-class accuracy (sorted best first) and the confusion matrix."""
    pred = probs.argmax(1)
    n_cls = max(len(classes), probs.shape[1])
    conf = np.zeros((n_cls, n_cls), dtype=np.int64)
    np.add.at(conf, (labels, pred), 1)
    k5 = min(5, probs.shape[1])
    top5 = np.argsort(-probs, axis=1, kind="stable")[:, :k5]
    per_class = []
    for c in range(n_cls):
        n = int(conf[c].sum())
        if n:
            per_class.append({"class": classes[c] if c < len(classes) else str(c), "label": c, "videos": n,
                              "accuracy": float(conf[c, c] / n)})
    per_class.sort(key=lambda r: (-r["accuracy"], r["label"]))
    return {
        "top1": float((pred == labels).mean()),
        "top5": float((top5 == labels[:, None]).any(1).mean()),
        "mean_class_accuracy": float(np.mean([r["accuracy"] for r in per_class])) if per_class else 0.0,
        "videos": int(len(labels)),
        "per_class": per_class,
        "confusion": conf.tolist(),
    }


def accuracy_tables(title: str, report: dict[str, Any], max_rows: int = 40) -> list[Table]:
    """Summary table and per-class table (best and worst classes, like the paper's SSv2 table)."""
    s = Table(title=title, min_width=len(title) + 4)
    for col in ("videos", "top-1 (%)", "top-5 (%)", "mean class acc (%)"):
        s.add_column(col, justify="right")
    s.add_row(str(report["videos"]), f"{100 * report['top1']:.2f}", f"{100 * report['top5']:.2f}",
              f"{100 * report['mean_class_accuracy']:.2f}")
    pc = Table(title="per-class accuracy (best first)")
    for col, j in (("class", "left"), ("videos", "right"), ("accuracy (%)", "right")):
        pc.add_column(col, justify=j)  # type: ignore[arg-type]
    rows = report["per_class"]
    shown = rows if len(rows) <= max_rows else rows[: max_rows // 2] + [None] + rows[-max_rows // 2 :]
    for r in shown:
        if r is None:
            pc.add_row("...", "", "")
        else:
            pc.add_row(r["class"], str(r["videos"]), f"{100 * r['accuracy']:.2f}")
    return [s, pc]


def confusion_figure(conf: np.ndarray, classes: list[str], title: str) -> Any:
    """The confusion matrix as a matplotlib Figure: colour = row-normalised share (each true class's row sums to
    1), the count of videos written in each non-empty cell (up to 30 classes), class names up to 60."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf = np.asarray(conf, dtype=np.int64)
    norm = conf / np.maximum(conf.sum(1, keepdims=True), 1)
    n = len(conf)
    side = min(20.0, max(4.5, 0.3 * n + 2.5))
    fig, ax = plt.subplots(figsize=(side + 1, side))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        for i, j in zip(*np.nonzero(conf)):
            ax.text(j, i, str(conf[i, j]), ha="center", va="center", fontsize=8 if n <= 15 else 6,
                    color="white" if norm[i, j] > 0.5 else "black")
    if n <= 60:
        names = (classes + [str(i) for i in range(len(classes), n)])[:n]
        ax.set_xticks(range(n), names, rotation=90, fontsize=7)
        ax.set_yticks(range(n), names, fontsize=7)
    ax.set_xlabel("predicted class")
    ax.set_ylabel(f"true class ({int(conf.sum())} test videos)")
    ax.set_title(f"{title}\nrow-normalised: each true class sums to 1" + ("\nnumbers: video counts" if n <= 30 else ""),
                 fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of the true class's videos")
    fig.tight_layout()
    return fig


def plot_confusion(conf: np.ndarray, classes: list[str], path: Path, title: str) -> Path:
    """:func:`confusion_figure` written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = confusion_figure(conf, classes, title)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # long class names: nothing cut at the edges
    plt.close(fig)
    return path


def copy_result(written: str | Path, json_path: str | Path | None) -> Path | None:
    """``--json PATH``: a copy of the result JSON ``written`` (in RUN/eval) at ``json_path``, nothing else beside
    it; rank 0 writes."""
    if json_path is None or Path(json_path).resolve() == Path(written).resolve():
        return None
    if dist.is_dist() and dist.get_rank() != 0:
        return Path(json_path)
    atomic_write_bytes(json_path, Path(written).read_bytes())
    return Path(json_path)


def finish(result: dict[str, Any], cfg: EvalConfig, encoder: Encoder | None, path: Path,
           tables: Callable[[dict[str, Any]], list[Table]], json_path: str | Path | None, quiet: bool) -> Path:
    """A protocol's end in one place: ``result`` gets its clip, framing, views and encoder
    (:func:`record`), is written with ``tables(result)`` beside it (:func:`write_result`) and
    copied to ``json_path`` (:func:`copy_result`); ``result["json"]`` says where it went."""
    record(result, cfg, encoder)
    written = write_result(result, path, tables(result), quiet=quiet)
    copy_result(written, json_path)
    result["json"] = str(written)
    return written
