"""AdamW whose parameter groups learn at ``lr * lr_scale`` (layer-wise lr decay, row ``adamw_vit`` of
:data:`moquad.train.optimizers.OPTIMIZERS`).

The training loops set every group's ``lr`` to the schedule's value each step; ``step`` applies each group's
``lr_scale`` for the update only, so a saved state holds the schedule's lr and resumes unchanged.
"""

from __future__ import annotations

import torch


class ScaledAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` with a per-group ``lr_scale`` (default 1)."""

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        base = [g["lr"] for g in self.param_groups]
        for g in self.param_groups:
            g["lr"] = g["lr"] * g.get("lr_scale", 1.0)
        try:
            return super().step(closure)
        finally:
            for g, lr in zip(self.param_groups, base):
                g["lr"] = lr
