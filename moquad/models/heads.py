"""Projection head H: the SimCLR/CVRL MLP on top of pooled backbone features."""

from __future__ import annotations

import torch
from torch import nn


class ProjectionHead(nn.Module):
    """Linear-BN-ReLU-Linear (SimCLR v1/CVRL style)."""

    def __init__(self, in_dim: int, hidden: int = 2048, out_dim: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden, bias=False),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
