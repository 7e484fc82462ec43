"""Shared plumbing of the evaluation stage: device and ranks, paths, the checkpoint hash, the frozen-backbone check."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch
from torch import nn

from moquad import dist
from moquad.config import EvalConfig
from moquad.errors import MoquadError


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


def sha256_file(path: str | Path) -> str:
    """sha256 hex digest of a file (the checkpoint's identity in every result).

    Read once per file version: a command asks for it from extraction (each split) and the result's
    provenance, so the digest is kept, keyed by the file's path, size and modification time."""
    st = os.stat(path)
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def checkpoint_sha256(path: str | Path) -> str:
    """:func:`sha256_file` of a checkpoint, with the error a user acts on when it is missing."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; pass --checkpoint RUN/checkpoints/last.pt")
    return sha256_file(path)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def out_dir(cfg: EvalConfig) -> Path:
    """``cfg.out``, else ``RUN/eval`` next to the checkpoint's run folder."""
    if cfg.out:
        return Path(cfg.out)
    if not cfg.checkpoint:
        raise MoquadError("no checkpoint to put the results beside; pass --out DIR")
    ckpt = Path(cfg.checkpoint)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run / "eval"


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


