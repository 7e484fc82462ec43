"""The optimizer table (``optimizer`` of pre-training, the linear probe and fine-tuning): ONE table, name ->
builder, and :func:`make_optimizer`, the one factory that reads it.

Adding an optimizer is one entry in :data:`OPTIMIZERS`. This module imports no torch at load time (each
builder imports its optimizer when called), so :mod:`moquad.settings` reads the names for free to check
the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

# a builder: (parameter groups of moquad.train.lars.param_groups, lr, weight decay) -> optimizer
Builder = Callable[[list[dict], float, float], "torch.optim.Optimizer"]


def _lars(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """SimCLR's LARS (momentum 0.9, trust coefficient 1e-3)."""
    from moquad.train.lars import LARS

    return LARS(groups, lr=lr, momentum=0.9, weight_decay=weight_decay, eeta=1e-3)


def _sgd(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD with momentum 0.9."""
    import torch

    return torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=weight_decay)


def _adamw(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with torch's defaults otherwise."""
    import torch

    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


OPTIMIZERS: dict[str, Builder] = {
    "lars": _lars,
    "sgd": _sgd,
    "adamw": _adamw,
}


def make_optimizer(module: nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """THE optimizer factory (pre-training, linear probe, fine-tuning) over ``module``'s trainable parameters:
    the :data:`OPTIMIZERS` row ``name``. BN and bias parameters get no weight decay (nor LARS adaptation)."""
    from moquad.train.lars import param_groups

    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    groups = [g for g in param_groups(module, weight_decay) if g["params"]]
    return OPTIMIZERS[name](groups, lr, weight_decay)
