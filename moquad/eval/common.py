"""Shared plumbing of the evaluation stage: checkpoint, data manifest, device, output files.

Every evaluation result records three things so a number can be traced back:
the protocol (the evaluation settings), the checkpoint (sha256 of the file) and the data
(a checksum of the manifest rows used, see :func:`manifest_checksum`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from moquad import dist
from moquad.config import EvalConfig, to_dict
from moquad.data.augment import normalize  # noqa: F401  (re-exported: eval sees pre-training's input statistics)
from moquad.preprocess.manifest import read_manifest
from moquad.train.checkpoint import load_model


def resolve_device(name: str) -> torch.device:
    """``auto`` -> this rank's CUDA device when available, else CPU."""
    return dist.pick_device(name, dist.env_ranks()[1])


def dist_env() -> tuple[int, int]:
    """(rank, world_size); starts the process group from torchrun's environment when needed."""
    if dist.is_dist():
        return dist.get_rank(), dist.get_world_size()
    if dist.env_ranks()[2] > 1:
        info = dist.init("cpu" if not torch.cuda.is_available() else "auto")
        return info.rank, info.world_size
    return 0, 1


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file (the checkpoint's identity in every result)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# evaluation reads checkpoints and manifests exactly as training and preprocessing write them
load_checkpoint = load_model
read_split = read_manifest


def dataset_classes(data_dir: str | Path, table: pa.Table | None = None) -> list[str]:
    """Class names in label order: dataset.json when present, else from the manifest rows."""
    info = Path(data_dir) / "dataset.json"
    if info.is_file():
        classes = json.loads(info.read_text()).get("classes")
        if classes:
            return list(classes)
    if table is None:
        raise FileNotFoundError(f"{info} not found; the data folder must come from `moquad preprocess`")
    names: dict[int, str] = {}
    for label, name in zip(table.column("label").to_pylist(), table.column("class_name").to_pylist()):
        if label >= 0:
            names[int(label)] = name
    return [names.get(i, str(i)) for i in range(max(names) + 1)] if names else []


def manifest_checksum(table: pa.Table) -> str:
    """sha256 over the rows' (video_id, label, class_name, payload checksum, num_frames).

    Identifies the data content independently of how the Parquet file was written or
    where the shards live, so a re-merged manifest of the same videos keeps the cache.
    """
    h = hashlib.sha256()
    cols = [table.column(c).to_pylist() for c in ("video_id", "label", "class_name", "checksum", "num_frames")]
    for row in zip(*cols):
        h.update(json.dumps(row).encode())
        h.update(b"\n")
    return h.hexdigest()


def out_dir(cfg: EvalConfig) -> Path:
    """``cfg.out``, else ``RUN/eval`` next to the checkpoint's run folder."""
    if cfg.out:
        return Path(cfg.out)
    ckpt = Path(cfg.checkpoint)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run / "eval"


def check_inputs(cfg: EvalConfig) -> None:
    """Clear errors for the settings every evaluation needs."""
    if not cfg.data:
        raise ValueError("no data folder given; pass --data DIR (the output of `moquad preprocess`)")
    if not Path(cfg.data).is_dir():
        raise FileNotFoundError(f"data folder {cfg.data} not found; pass --data DIR from `moquad preprocess`")
    if not cfg.checkpoint:
        raise ValueError("no checkpoint given; pass --checkpoint RUN/checkpoints/last.pt")
    if not Path(cfg.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {cfg.checkpoint} not found; pass --checkpoint RUN/checkpoints/last.pt")
    if cfg.crops not in (1, 3):
        raise ValueError(f"crops must be 1 (centre) or 3 (left/centre/right), got {cfg.crops}")
    if cfg.num_clips < 1 or cfg.frames < 1 or cfg.dilation < 1:
        raise ValueError("num_clips, frames and dilation must all be >= 1")


def provenance(cfg: EvalConfig, splits: dict[str, pa.Table]) -> dict[str, Any]:
    """The record every result carries: full eval config, checkpoint hash, manifest checksums."""
    return {
        "config": to_dict(cfg),
        "checkpoint": {"path": str(Path(cfg.checkpoint).resolve()), "sha256": sha256_file(cfg.checkpoint)},
        "data": {
            "dir": str(Path(cfg.data).resolve()),
            "manifests": {s: {"videos": t.num_rows, "checksum": manifest_checksum(t)} for s, t in splits.items()},
        },
    }


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


def write_result(result: dict[str, Any], json_path: str | Path, tables: list[Table]) -> Path:
    """Write ``result`` as JSON and the same numbers as a text table beside it (``.txt``); print the tables."""
    json_path = Path(json_path)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return json_path  # one writer under torchrun: every rank computed the same numbers
    json_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(result), indent=2) + "\n")
    tmp.replace(json_path)
    console = Console(record=True, width=110)
    for t in tables:
        console.print(t)
    json_path.with_suffix(".txt").write_text(console.export_text())
    return json_path


def protocol_table(title: str, result: dict[str, Any]) -> Table:
    """Small key/value table of the provenance block (checkpoint, data, protocol)."""
    t = Table(title=title, show_header=False, min_width=len(title) + 4)
    t.add_column("key")
    t.add_column("value")
    t.add_row("checkpoint", f"{result['checkpoint']['path']} (sha256 {result['checkpoint']['sha256'][:12]})")
    for split, m in result["data"]["manifests"].items():
        t.add_row(f"data {split}", f"{result['data']['dir']} ({m['videos']} videos, {m['checksum'][:12]})")
    for k, v in result.get("protocol", {}).items():
        t.add_row(k, str(v))
    return t


def make_optimizer(module: nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """Optimizer over ``module``'s trainable parameters.

    ``lars``: moquad.train.lars (SimCLR's LARS, no decay/adaptation on BN and bias) when
    present, else SGD with momentum 0.9 as a fallback; ``sgd``; ``adamw``.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if name == "lars":
        try:
            from moquad.train.lars import LARS, param_groups
        except ImportError:
            return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
        return LARS(param_groups(module, weight_decay), lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose lars, sgd or adamw")


def lr_per_step(base: float, total: int) -> list[float]:
    """Half-period cosine from ``base`` to 0 over ``total`` steps, no warm-up; ``base`` is used as given
    (the paper's fine-tuning lr 0.08 is for batch 32, not rescaled). moquad.train.schedule when present."""
    try:
        from moquad.train.schedule import lr_schedule
    except ImportError:
        return [0.5 * base * (1.0 + float(np.cos(np.pi * s / max(1, total)))) for s in range(total)]
    return lr_schedule(base, 256, max(1, total), 0).tolist()


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copy of every parameter AND buffer (BN running mean/var, num_batches_tracked)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def check_unchanged(module: nn.Module, before: dict[str, torch.Tensor], what: str = "backbone") -> None:
    """moco-style sanity check: raise if any weight or BN statistic differs from ``before``."""
    now = module.state_dict()
    changed = [k for k, v in before.items() if k not in now or not torch.equal(now[k].detach().cpu(), v.cpu())]
    if changed or set(now) != set(before):
        raise RuntimeError(f"the frozen {what} changed during evaluation ({', '.join(changed[:5])}...); "
                           "the result is invalid: weights or BN statistics must stay as in the checkpoint")


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
