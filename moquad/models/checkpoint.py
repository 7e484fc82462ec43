"""Reading a ``moquad pretrain`` checkpoint: the dict (:func:`load`, ``weights_only=True``) and the network it
describes (:func:`load_model`). Writing, resuming and the layout live with training (``moquad.train.checkpoint``);
evaluation, export and CAM read a checkpoint here, below both.

A file that is not such a dict (garbage, truncated, empty, a plain state dict, a pickle ``weights_only`` refuses)
raises a one-line :class:`MoquadError` ``CKPT is not a moquad checkpoint (<reason>)``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

from moquad.errors import DISK_ERRNOS, MoquadError
from moquad.models.backbones import BACKBONES, DEFAULT_INPUT
from moquad.models.model import VideoModel, build_model

# what every moquad checkpoint holds
REQUIRED = ("model", "config")


def not_moquad(path: Path, reason: str) -> MoquadError:
    return MoquadError(f"{path} is not a moquad checkpoint ({reason}); use a RUN/checkpoints/last.pt of `moquad pretrain`")


def _unreadable_reason(e: Exception) -> str:
    """Why ``torch.load`` failed, in a few words (torch's own text suggests weights_only=False: never shown)."""
    text = str(e)
    if "Weights only load failed" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        if found:
            return (f"refused for safety: it holds a pickled Python object ({found[1]}), which a checkpoint "
                    "loaded with weights_only=True may not; moquad checkpoints hold only tensors and plain values")
        return "not a PyTorch file: its pickle data cannot be read"
    if isinstance(e, EOFError):
        return "the file ends early: empty or truncated"
    if "PytorchStreamReader" in text or "zip archive" in text:
        return "truncated or corrupted: its zip archive cannot be read"
    return f"unreadable: {type(e).__name__}: {text.splitlines()[0][:120] if text.strip() else 'no detail'}"


def load(path: str | Path, require: tuple[str, ...] = REQUIRED) -> dict[str, Any]:
    """Read a checkpoint on CPU with ``weights_only=True`` (no arbitrary code from the file).

    ``require``: entries the dict must have (a checkpoint to continue training from also holds ``optimizer``,
    ``step`` and ``epoch``).
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise FileNotFoundError(f"checkpoint {path} {what}; pass RUN/checkpoints/last.pt of a pretrain run")
    if path.stat().st_size == 0:
        raise not_moquad(path, "empty file")
    try:
        with warnings.catch_warnings():  # torch's note on an old pickle protocol adds nothing to our message
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        if e.errno in DISK_ERRNOS or isinstance(e, FileNotFoundError):
            raise
        raise not_moquad(path, _unreadable_reason(e)) from e
    except Exception as e:  # any parse failure of a user-supplied file
        raise not_moquad(path, _unreadable_reason(e)) from e
    if not isinstance(ckpt, dict):
        raise not_moquad(path, f"it holds a {type(ckpt).__name__}, not a checkpoint dict")
    missing = [k for k in require if k not in ckpt]
    if missing:
        if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):  # weights only: say where they fit
            archs = ", ".join(name for name, b in BACKBONES.items() if b.torchvision is not None)
            raise not_moquad(path, f"a plain state dict: weights without a moquad config; `moquad motion` reads "
                                    f"torchvision video weights as ARCH:{path} with ARCH one of {archs}")
        raise not_moquad(path, f"no {' or '.join(repr(k) for k in missing)} entry")
    return ckpt


def load_model(path: str | Path) -> tuple[VideoModel, dict[str, Any]]:
    """Rebuild the :class:`VideoModel` described by the checkpoint's config and load its weights."""
    ckpt = load(path)
    cfg = ckpt["config"]
    missing = [k for k in ("backbone", "proj_dim", "proj_hidden") if not isinstance(cfg, dict) or k not in cfg]
    if missing:
        raise not_moquad(Path(path), f"its config lacks {', '.join(missing)}")
    try:
        model_input = cfg.get("model_input", DEFAULT_INPUT)
        model = build_model(cfg["backbone"], cfg["proj_dim"], cfg["proj_hidden"], model_input)
        model.load_state_dict(ckpt["model"])
    except (ValueError, TypeError, RuntimeError, AttributeError) as e:
        detail = re.sub(r"^Error\(s\) in loading state_dict for \w+:\s*", "", " ".join(str(e).split()))[:200]
        raise not_moquad(Path(path), f"its weights do not fit the {cfg['backbone']!r} model its config names: "
                                      f"{detail or type(e).__name__}") from e
    return model, ckpt
