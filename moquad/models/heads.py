"""Projection head H: the SimCLR/CVRL MLP on top of pooled backbone features."""

from __future__ import annotations

import torch
from torch import nn


class ProjectionHead(nn.Module):
    """Linear-BN-ReLU-Linear (SimCLR v1/CVRL style); sizes from ``PretrainConfig.proj_hidden`` / ``proj_dim``."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden, bias=False),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
