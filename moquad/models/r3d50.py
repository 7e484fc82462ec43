"""R3D-50: the 3D ResNet-50 used by CVRL (Qian et al., 2021), the paper's largest backbone.

A SlowOnly-style ResNet-50 with CVRL's stem: conv1 5x7x7 with stride 2 in time and space
(16 input frames -> 8), then a 1x3x3 max-pool (spatial stride 2). Bottleneck blocks
[3, 4, 6, 3]; res2/res3 use 1x1x1 first convolutions and res4/res5 3x1x1 (temporal
"inflation" only in the last two stages); no further temporal striding. The last BN of each
block starts at zero (each residual block starts as the identity), as in SlowFast/CVRL.
Output: global average pool -> 2048-d features.
"""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck3D(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, temporal_kernel: int):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv3d(
            cin, planes, (temporal_kernel, 1, 1), padding=(temporal_kernel // 2, 0, 0), bias=False
        )
        self.bn1 = nn.BatchNorm3d(planes)
        self.conv2 = nn.Conv3d(
            planes, planes, (1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1), bias=False
        )
        self.bn2 = nn.BatchNorm3d(planes)
        self.conv3 = nn.Conv3d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm3d(cout)
        nn.init.zeros_(self.bn3.weight)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv3d(cin, cout, 1, stride=(1, stride, stride), bias=False), nn.BatchNorm3d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class R3D50(nn.Module):
    """CVRL's 3D ResNet-50 trunk (no classifier); ``forward`` returns (N, 2048)."""

    def __init__(
        self,
        layers: tuple[int, int, int, int] = (3, 4, 6, 3),
        temporal_kernels: tuple[int, int, int, int] = (1, 1, 3, 3),
    ):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv3d(3, 64, (5, 7, 7), stride=(2, 2, 2), padding=(2, 3, 3), bias=False),
            nn.BatchNorm3d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        )
        stages = []
        cin = 64
        for i, (n, tk) in enumerate(zip(layers, temporal_kernels)):
            planes = 64 * 2**i
            blocks = []
            for j in range(n):
                blocks.append(
                    Bottleneck3D(cin, planes, stride=2 if (j == 0 and i > 0) else 1, temporal_kernel=tk)
                )
                cin = planes * Bottleneck3D.expansion
            stages.append(nn.Sequential(*blocks))
        self.res2, self.res3, self.res4, self.res5 = stages
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.out_dim = cin
        for m in self.modules():
            if isinstance(m, nn.Conv3d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.res5(self.res4(self.res3(self.res2(x))))
        return self.pool(x).flatten(1)
