"""The pre-trained model: backbone F plus projection head H of the paper."""

from __future__ import annotations

import torch
from torch import nn

from moquad.models.backbones import DEFAULT_INPUT, build_backbone
from moquad.models.heads import ProjectionHead


class VideoModel(nn.Module):
    """A backbone with a projection head, as pre-training trains it (``moquad.build_model`` builds one).

    ``model.backbone(x)``: pooled features (N, feat_dim) of clips (N, 3, T, H, W), what evaluation uses;
    ``model(x)``: the projection (N, proj_dim) the contrastive losses use (not normalised here: the losses
    normalise)."""

    def __init__(self, backbone: nn.Module, feat_dim: int, proj_hidden: int, proj_dim: int):
        super().__init__()
        self.backbone = backbone
        self.feat_dim = feat_dim
        self.head = ProjectionHead(feat_dim, proj_hidden, proj_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build_model(name: str, proj_dim: int, proj_hidden: int, model_input: str = DEFAULT_INPUT) -> VideoModel:
    """Backbone ``name`` (a row of ``moquad.BACKBONES``) reading ``model_input`` (``rgb``, or ``diff``: frame
    differences) with a fresh projection head, randomly initialised.

    The head sizes have no default here: they are ``PretrainConfig.proj_dim`` / ``proj_hidden``.
    """
    backbone, feat_dim = build_backbone(name, model_input)
    return VideoModel(backbone, feat_dim, proj_hidden=proj_hidden, proj_dim=proj_dim)
