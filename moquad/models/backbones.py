"""Video backbones. Each returns pooled features (N, D) from clips (N, 3, T, H, W).

- ``tiny``: a 4-layer 3D CNN (~0.1 M params) for tests and the CPU demo.
- ``r3d_18``, ``r2plus1d_18``, ``s3d``: torchvision architectures, random init.
- ``r3d_50``: 3D ResNet-50 as used by CVRL (slow pathway of SlowFast R50 style).
"""

from __future__ import annotations

import torch
import torchvision.models.video as tvv
from torch import nn

BACKBONES = ("tiny", "r3d_18", "r2plus1d_18", "s3d", "r3d_50")


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


class _TorchvisionTrunk(nn.Module):
    """A torchvision video classifier with its final fc removed."""

    def __init__(self, net: nn.Module, out_dim: int):
        super().__init__()
        net.fc = nn.Identity()
        self.net = net
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class S3DTrunk(nn.Module):
    """torchvision S3D without its classifier: features -> global average pool."""

    def __init__(self):
        super().__init__()
        net = tvv.s3d(weights=None)
        self.features = net.features
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.out_dim = 1024

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x)).flatten(1)


def build_backbone(name: str) -> tuple[nn.Module, int]:
    """Return ``(module, feature_dim)`` for a backbone name."""
    if name == "tiny":
        net: nn.Module = TinyNet()
    elif name == "r3d_18":
        net = _TorchvisionTrunk(tvv.r3d_18(weights=None), 512)
    elif name == "r2plus1d_18":
        net = _TorchvisionTrunk(tvv.r2plus1d_18(weights=None), 512)
    elif name == "s3d":
        net = S3DTrunk()
    elif name == "r3d_50":
        from moquad.models.r3d50 import R3D50

        net = R3D50()
    else:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(BACKBONES)}")
    return net, net.out_dim
