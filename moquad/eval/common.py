"""Shared plumbing of the evaluation stage: device and ranks, paths, input checks, the frozen-backbone check."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from moquad import dist
from moquad.config import EvalConfig
from moquad.objstore import is_url


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
    if not is_url(cfg.data) and not Path(cfg.data).is_dir():
        raise FileNotFoundError(f"data folder {cfg.data} not found; pass --data DIR from `moquad preprocess`")
    if not cfg.checkpoint:
        raise ValueError("no checkpoint given; pass --checkpoint RUN/checkpoints/last.pt")
    if not Path(cfg.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {cfg.checkpoint} not found; pass --checkpoint RUN/checkpoints/last.pt")
    if cfg.crops not in (1, 3):
        raise ValueError(f"crops must be 1 (centre) or 3 (left/centre/right), got {cfg.crops}")
    if cfg.num_clips < 1 or cfg.frames < 1 or cfg.dilation < 1:
        raise ValueError("num_clips, frames and dilation must all be >= 1")


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


