"""Checkpoints: one dict written atomically (temp file + ``os.replace``), read with ``weights_only=True``.

Layout (CONTRACTS.md): ``{"model", "optimizer", "step", "epoch", "config", "seeds",
"moquad_version", "git"}``; ``step`` counts optimizer steps done, ``epoch`` the epoch the
next step belongs to. Evaluation rebuilds the model from ``config`` via :func:`load_model`.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

import moquad
from moquad.models import VideoModel, build_model


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """Commit hash of the checkout moquad is imported from, or None outside a git work tree."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(moquad.__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def save(ckpt: dict[str, Any], path: str | Path) -> Path:
    """Write ``ckpt`` to ``path`` atomically: a crash leaves the previous file intact, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint on CPU with ``weights_only=True`` (no arbitrary code from the file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path} not found; pass RUN/checkpoints/last.pt of a pretrain run"
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model(path: str | Path) -> tuple[VideoModel, dict[str, Any]]:
    """Rebuild the :class:`VideoModel` described by the checkpoint's config and load its weights."""
    ckpt = load(path)
    cfg = ckpt.get("config") or {}
    missing = [k for k in ("backbone", "proj_dim", "proj_hidden") if k not in cfg]
    if "model" not in ckpt or missing:
        raise ValueError(f"{path} is not a moquad pretrain checkpoint (missing model or config {missing})")
    model = build_model(cfg["backbone"], proj_dim=cfg["proj_dim"], proj_hidden=cfg["proj_hidden"])
    model.load_state_dict(ckpt["model"])
    return model, ckpt
