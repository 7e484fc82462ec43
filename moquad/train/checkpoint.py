"""Checkpoints: one dict written atomically (temp file + ``os.replace``), read with ``weights_only=True``.

Layout (:func:`build`, the one place it is written): ``{"model", "step", "epoch", "config", "seeds",
"moquad_version", "git"}``, plus ``"optimizer", "steps_per_epoch", "data_checksum"`` in a training run's and
``"momentum"`` (:meth:`moquad.train.momentum.MomentumEncoder.state_dict`: EMA weights, queue, pointer) in a run of a
method with a momentum encoder, ``"losses"`` (stage name -> state) in one whose loss keeps state (an EMA centre);
``step`` counts optimizer steps done, ``epoch`` the epoch the next step belongs to. Evaluation
rebuilds the model from ``config`` via :func:`load_model`. A file that is not such a dict
(garbage, truncated, empty, a plain state dict, a pickle ``weights_only`` refuses) raises a
one-line :class:`MoquadError` ``CKPT is not a moquad checkpoint (<reason>)``. A disk that fills while
a checkpoint is written is one line too (torch reports it as a ``RuntimeError``, not an ``OSError``); the
previous checkpoint stays and the temp file goes. :func:`resume` loads ``last.pt`` into a run that continues.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import torch

import moquad
from moquad.config import PretrainConfig, to_dict
from moquad.errors import MoquadError, free_mb, setting
from moquad.io import atomic_write, remove_stale_temps
from moquad.models.checkpoint import REQUIRED, load, load_model, not_moquad  # noqa: F401  (reading: below training)

# resuming needs these (every checkpoint holds REQUIRED: moquad.models.checkpoint)
RESUME_KEYS = ("model", "optimizer", "step", "epoch", "config")
# settings that may change when a run is resumed; every other resolved setting must match
RESUME_MAY_CHANGE = ("out", "data", "resume", "ckpt_every", "log_every", "device", "loader.workers", "sync_bn",
                     "loader.max_bad_fraction", "loader.max_bad_count")
# settings added after checkpoints were written: what a run that predates the setting did (resuming such a run
# compares against this value, so `--set KEY=VALUE` with it continues the run exactly as it was)
RESUME_ADDED = {"loader.scaled_decode": False, "momentum": 0.99, "queue_size": 4096, "symmetric": None,
                "predictor": None, "key_bn": None, "key_bn_group": 4}
# how torch's zip writer reports a failed write (a full disk, a quota) instead of raising an OSError
_TORCH_WRITE_FAILED = ("unexpected pos", "PytorchStreamWriter failed", "enforce fail at inline_container")


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


def build(cfg: PretrainConfig, model: torch.nn.Module, step: int, epoch: int, *,
          optimizer: torch.optim.Optimizer | None = None, steps_per_epoch: int | None = None,
          data_checksum: str | None = None, momentum: dict[str, Any] | None = None,
          losses: dict[str, Any] | None = None) -> dict[str, Any]:
    """THE checkpoint dict of ``model`` (the plain, unwrapped model) trained under ``cfg``. A training run
    passes ``optimizer`` (then ``steps_per_epoch`` and ``data_checksum`` go in too: what :func:`resume`
    checks); without it, as for the untrained network, the file cannot be resumed."""
    ckpt = {"model": model.state_dict(), "step": step, "epoch": epoch, "config": to_dict(cfg),
            "seeds": {"seed": cfg.seed, "loader_seed": cfg.loader.seed}, "moquad_version": moquad.__version__,
            "git": git_revision()}
    if optimizer is not None:
        ckpt.update(optimizer=optimizer.state_dict(), steps_per_epoch=steps_per_epoch,
                    data_checksum=data_checksum)
    if momentum is not None:
        ckpt["momentum"] = momentum
    if losses is not None:
        ckpt["losses"] = losses
    return ckpt


def save(ckpt: dict[str, Any], path: str | Path, resume_hint: str = "re-run with --resume to continue") -> Path:
    """Write ``ckpt`` to ``path`` atomically (:func:`moquad.io.atomic_write`): a crash leaves the previous file
    intact, never half a file; stale temp files of earlier, interrupted writes beside ``path`` go first."""
    path = Path(path)
    remove_stale_temps(path.parent)
    try:
        return atomic_write(path, lambda f: torch.save(ckpt, f), resume_hint)
    except RuntimeError as e:
        if not any(m in str(e) for m in _TORCH_WRITE_FAILED):
            raise
        raise MoquadError(f"could not write {path}: the disk is full or failing ({free_mb(path):.0f} MB free; torch: "
                          f"{' '.join(str(e).split())[:80]}); the previous checkpoint is intact; free space and "
                          f"{resume_hint}") from e


def resume(cfg: PretrainConfig, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, spe: int,
           checksum: str | None, momentum: Any = None, losses: dict[str, Any] | None = None) -> int:
    """Load ``path`` when resuming (its momentum encoder into ``momentum``, the state of each stateful stage loss
    into ``losses``, by stage name) and return the step to continue from (0 for a new run)."""
    if not path.is_file():
        return 0
    if not cfg.resume:
        raise ValueError(f"{path.parent.parent} already holds a checkpoint; pass --resume to continue it or choose a new --out")
    ckpt = load(path, require=RESUME_KEYS)
    check_global_batch(ckpt.get("config") or {}, cfg.batch_size, path)
    check_resume(ckpt.get("config") or {}, to_dict(cfg), path)
    if ckpt.get("steps_per_epoch", spe) != spe:
        raise ValueError(f"cannot resume {path}: it was trained with {ckpt['steps_per_epoch']} steps per epoch, "
                         f"the data now gives {spe}")
    if checksum and ckpt.get("data_checksum") not in (None, checksum):
        raise ValueError(f"cannot resume {path}: the data in {cfg.data} is not the data it was trained on "
                         "(manifest checksum differs); use the original data or a new --out")
    if momentum is not None and not isinstance(ckpt.get("momentum"), dict):
        raise MoquadError(f"cannot resume {path}: method {cfg.method!r} has a momentum encoder and the checkpoint "
                          "holds none; use a new --out")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if momentum is not None:
        momentum.load_state_dict(ckpt["momentum"])
    for name, state in (ckpt.get("losses") or {}).items():
        if hasattr((losses or {}).get(name), "load_state_dict"):
            losses[name].load_state_dict(state)
    return int(ckpt["step"])


def resume_message(path: Path, start: int, spe: int, epochs: int) -> str:
    """The line a ``--resume`` run prints: the checkpoint and step it continues from, or that it starts fresh."""
    if not path.is_file():
        return f"no checkpoint in {path.parent.parent}: starting fresh"
    total = spe * epochs
    if start >= total:
        return f"resuming from {path} at step {start} of {total}: all {epochs} epochs are done, nothing to train"
    where = "the start of" if start % spe == 0 else f"step {start % spe + 1} of {spe} in"
    return f"resuming from {path} at step {start} of {total} (continuing at {where} epoch {start // spe + 1} of {epochs})"


def check_global_batch(saved: dict[str, Any], batch_size: int, path: Path) -> None:
    """Elastic resume: ranks and workers may change, the GLOBAL batch may not (the epoch plan slices each epoch's
    permutation by it, so another batch would be another data order: refused rather than silently re-planned)."""
    old = saved.get("batch_size")
    if old is not None and old != batch_size:
        raise MoquadError(f"cannot resume {path}: it was trained with global batch {old}, now {batch_size}; the data "
                          f"order of every step depends on the global batch, so resume with {setting('batch_size', old)} (on any "
                          "number of processes that divides it; per-rank batch = global / processes) or use a new --out")


def check_resume(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """Every resolved setting must match the checkpoint's, except those in RESUME_MAY_CHANGE."""
    def flat(d: dict, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    written, new = flat(saved), flat(now)
    old = {**RESUME_ADDED, **written}
    diff = [k for k in sorted(set(old) | set(new)) if k not in RESUME_MAY_CHANGE and old.get(k) != new.get(k)]
    if diff:
        pairs = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff)
        sets = " ".join(f"--set {k}={str(old[k]).lower()}" for k in diff if k in RESUME_ADDED and k not in written)
        hint = f"resume with {sets}" if sets and all(k in RESUME_ADDED for k in diff) else "use the original settings"
        raise ValueError(f"cannot resume {path}: settings changed ({pairs}); {hint} or a new --out")
