"""Per-step schedules, precomputed so a resumed run and a plot read the same numbers.

- :func:`lr_schedule`: SimCLR's linear warm-up then half-period cosine decay to 0, with the
  base lr scaled linearly with the global batch (``lr * global_batch / 256``).

Algorithm 1's stage of each epoch is the method's (:meth:`moquad.train.methods.Method.epoch_stages`).
"""

from __future__ import annotations

import math

import torch


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: ``base_lr`` is the lr at batch 256."""
    return base_lr * global_batch / 256.0


def lr_schedule(base_lr: float, global_batch: int, total_steps: int, warmup_steps: int) -> torch.Tensor:
    """lr for each step 0..total_steps-1 (float64).

    step < W: ``peak * step / W`` (SimCLR: starts at 0); then ``peak * 0.5 * (1 + cos(pi * t / T))``
    with ``t = step - W`` and ``T = total_steps - W``.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    peak = scaled_lr(base_lr, global_batch)
    w = max(0, min(int(warmup_steps), total_steps))
    out = torch.empty(total_steps, dtype=torch.float64)
    for s in range(total_steps):
        if s < w:
            out[s] = peak * s / w
        else:
            t, span = s - w, total_steps - w
            out[s] = peak * 0.5 * (1.0 + math.cos(math.pi * t / span))
    return out
