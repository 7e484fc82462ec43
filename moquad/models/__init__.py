"""Video encoders + projection head.

:data:`BACKBONES` (:mod:`moquad.models.backbones`) is the one table of backbones;
``build_model(name, proj_dim, proj_hidden)`` returns a :class:`VideoModel` (:mod:`moquad.models.model`).
Importing this package does not import torch (the config reads the backbone names from it);
``VideoModel``, ``build_model`` and ``ProjectionHead`` import it on first use.
"""

from __future__ import annotations

from typing import Any

from moquad.models.backbones import (
    BACKBONES,
    INPUTS,
    TORCHVISION_ARCHS,
    Backbone,
    TokenMap,
    TorchvisionNames,
    build_backbone,
)

__all__ = ["BACKBONES", "INPUTS", "TORCHVISION_ARCHS", "Backbone", "TokenMap", "TorchvisionNames", "VideoModel",
           "build_model", "build_backbone", "ProjectionHead"]

_LAZY = {"VideoModel": "moquad.models.model", "build_model": "moquad.models.model",
         "ProjectionHead": "moquad.models.heads"}


def __getattr__(name: str) -> Any:
    """``from moquad.models import build_model`` imports torch only then (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
