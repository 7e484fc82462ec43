"""LARS exactly as in SimCLR (``lars_optimizer.py`` of google-research/simclr, classic momentum).

Per parameter ``w`` with gradient ``g`` (``lr`` from the schedule, momentum m, trust coefficient eeta):

    g <- g + weight_decay * w                     (skipped for BN and bias parameters)
    trust = eeta * ||w|| / ||g||  if ||w|| > 0 and ||g|| > 0 else 1   (1 for BN and bias)
    v <- m * v + lr * trust * g
    w <- w - v                    (Nesterov: w <- w - (m * v + lr * trust * g))

Note that the norm of ``g`` is taken after adding weight decay, and the learning rate is
inside the momentum buffer, both as in SimCLR. The optimizer setting's table (``lars``, ``sgd``, ``adamw``) and
the factory are :mod:`moquad.train.optimizers`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: regular weights (decay + adaptation) and BN/bias parameters (neither)."""
    excluded: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if isinstance(module, _NORM_TYPES) or name == "bias":
                excluded.add(id(p))
    regular = [p for p in model.parameters() if p.requires_grad and id(p) not in excluded]
    special = [p for p in model.parameters() if p.requires_grad and id(p) in excluded]
    return [
        {"params": regular, "weight_decay": weight_decay, "lars_adapt": True},
        {"params": special, "weight_decay": 0.0, "lars_adapt": False},
    ]


class LARS(torch.optim.Optimizer):
    """SimCLR's LARS. Param groups may set ``weight_decay`` and ``lars_adapt`` (see :func:`param_groups`)."""

    def __init__(
        self,
        params: Iterable,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eeta: float = 1e-3,
        nesterov: bool = False,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eeta <= 0:
            raise ValueError("LARS needs lr >= 0, momentum >= 0, weight_decay >= 0 and eeta > 0")
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, eeta=eeta, nesterov=nesterov, lars_adapt=True
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, m, wd, eeta = group["lr"], group["momentum"], group["weight_decay"], group["eeta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                w = p.float()
                if wd != 0:
                    grad = grad + wd * w
                scaled_lr = torch.as_tensor(lr, dtype=torch.float32, device=p.device)
                if group["lars_adapt"]:
                    w_norm = torch.linalg.vector_norm(w)
                    g_norm = torch.linalg.vector_norm(grad)
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0),
                        eeta * w_norm / g_norm.clamp_min(1e-38),
                        torch.ones_like(w_norm),
                    )
                    scaled_lr = scaled_lr * trust
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(w)
                v = state["momentum_buffer"]
                v.mul_(m).add_(scaled_lr * grad)
                update = m * v + scaled_lr * grad if group["nesterov"] else v
                p.sub_(update.to(p.dtype))
        return loss

