"""Backbone networks: each maps clips (N, 3, T, H, W) to pooled features (N, D); D is the row's ``dim``.

``TinyNet`` (tests, CPU demo) and the wrappers that strip torchvision's video classifiers;
:mod:`moquad.models.backbones` names them (R3D-50 is :mod:`moquad.models.r3d50`).
"""

from __future__ import annotations

import torch
import torchvision.models.video as tvv
from torch import nn


class TinyNet(nn.Module):
    """Small 3D CNN: enough capacity to learn motion on synthetic data, fast on 2 CPU cores."""

    def __init__(self, width: int = 32):
        super().__init__()

        def block(cin: int, cout: int, stride: tuple[int, int, int]) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm3d(cout),
                nn.ReLU(inplace=True),
            )

        self.features = nn.Sequential(
            block(3, width // 2, (1, 1, 1)),  # full resolution first: motions of 1-2 px stay visible
            block(width // 2, width, (1, 2, 2)),
            block(width, width * 2, (2, 2, 2)),
            block(width * 2, width * 2, (2, 2, 2)),
        )
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.out_dim = width * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x)).flatten(1)


class TorchvisionTrunk(nn.Module):
    """A torchvision video classifier with its final fc removed."""

    def __init__(self, net: nn.Module):
        super().__init__()
        net.fc = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class S3DTrunk(nn.Module):
    """torchvision S3D without its classifier: features -> global average pool."""

    def __init__(self):
        super().__init__()
        net = tvv.s3d(weights=None)
        self.features = net.features
        self.pool = nn.AdaptiveAvgPool3d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x)).flatten(1)

