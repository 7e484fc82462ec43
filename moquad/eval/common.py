"""Shared plumbing of the evaluation stage: device and ranks, the run-folder layout, the splits a protocol uses,
the checkpoint hash, the frozen-backbone check."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch
from torch import nn

from moquad import dist
from moquad.config import EvalConfig
from moquad.data.store import Split
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


def run_folder(checkpoint: str | Path) -> Path:
    """The run folder a checkpoint belongs to: ``RUN`` of ``RUN/checkpoints/last.pt``, else the file's folder."""
    ckpt = Path(checkpoint)
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def eval_folder(checkpoint: str | Path) -> Path:
    """``RUN/eval``: where the evaluations of a checkpoint go by default (``moquad export`` reads them there)."""
    return run_folder(checkpoint) / "eval"


def out_dir(cfg: EvalConfig) -> Path:
    """``cfg.out``, else ``RUN/eval`` next to the checkpoint's run folder."""
    if cfg.out:
        return Path(cfg.out)
    if not cfg.checkpoint:
        raise MoquadError("no checkpoint to put the results beside; pass --out DIR")
    return eval_folder(cfg.checkpoint)


def labelled_splits(cfg: EvalConfig, task: str) -> tuple[Split, Split]:
    """The (train, test) splits ``cfg`` names, each with labelled videos; else the error a user acts on
    (a protocol over 0 labelled videos gives no number, e.g. SSv2's unlabelled test split)."""
    splits = Split(cfg.data, cfg.train_split), Split(cfg.data, cfg.test_split)
    for split, flag in zip(splits, ("--train-split", "--test-split")):
        if not (split.label >= 0).any():
            raise MoquadError(f"{task} needs labelled videos, and split {split.split!r} of {cfg.data} has none "
                              f"(0 of {len(split)}); pass {flag} with a labelled split (SSv2 and K400: val, as "
                              "their eval recipes set)")
    return splits


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


