"""Video encoders + projection head.

``build_model(name)`` returns a :class:`VideoModel`: ``model.backbone(x)`` maps a
normalised clip batch (N, 3, T, H, W) to pooled features (N, feat_dim) (the features
used by evaluation); ``model(x)`` adds the MLP projection head (N, proj_dim) used by the
contrastive losses (not normalised here: the losses normalise).
"""

from __future__ import annotations

import torch
from torch import nn

from moquad.models.backbones import BACKBONES, build_backbone
from moquad.models.heads import ProjectionHead

__all__ = ["BACKBONES", "VideoModel", "build_model", "build_backbone", "ProjectionHead"]


class VideoModel(nn.Module):
    """Backbone F and projection head H of the paper."""

    def __init__(self, backbone: nn.Module, feat_dim: int, proj_hidden: int = 2048, proj_dim: int = 128):
        super().__init__()
        self.backbone = backbone
        self.feat_dim = feat_dim
        self.head = ProjectionHead(feat_dim, proj_hidden, proj_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build_model(name: str, proj_dim: int = 128, proj_hidden: int = 2048) -> VideoModel:
    """Backbone ``name`` (see ``BACKBONES``) with a fresh projection head, randomly initialised."""
    backbone, feat_dim = build_backbone(name)
    return VideoModel(backbone, feat_dim, proj_hidden=proj_hidden, proj_dim=proj_dim)
