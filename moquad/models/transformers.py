"""Video transformers: torchvision's ``swin3d_t`` and ``mvit_v2_s`` (random init) without their classifiers.

Each trunk keeps torchvision's module tree under ``net`` (so an export is torchvision's state dict minus the head)
and maps clips (N, 3, T, H, W) to pooled features (their size: the backbone row's ``dim``) at ANY clip size:

- ``SwinTrunk``: torchvision's own forward with ``head = Identity``: patch embedding, four stages of shifted-window
  attention (torchvision pads to the window), LayerNorm, global average pool. Nothing depends on the clip size.
- ``MViTTrunk``: torchvision's ``MViT.forward`` takes the token grid from ``pos_encoding.temporal_size /
  spatial_size``, fixed at build time (16 x 224 for ``mvit_v2_s()``, whose builder refuses other sizes: it passes
  ``temporal_size`` itself). This forward reads the grid from the patch embedding's output instead; the
  relative-position tables keep ``mvit_v2_s()``'s shapes and torchvision's ``_add_rel_pos`` interpolates them
  (linearly) to the grid, as MViTv2 does when fine-tuned at another size. The feature is the class token after the
  final LayerNorm (MViT's classifier input).

Both train without stochastic depth (:func:`_without_drop_path`). Both expose what the transformer optimizer (``moquad.train.optimizers``, row ``adamw_vit``) reads, timm's
convention: ``no_weight_decay()`` (the position tables) and ``num_layers`` / ``layer_id(name)`` (layer-wise lr
decay). The tokens CAM reads are declared in the backbone table (``moquad.models.backbones.TokenMap``).
"""

from __future__ import annotations

import re

import torch
import torchvision.models.video as tvv
from torch import nn
from torchvision.ops import StochasticDepth


def _without_drop_path(net: nn.Module) -> nn.Module:
    """Stochastic depth off (torchvision builds swin3d_t at 0.1, mvit_v2_s at 0.2): training is then a function of
    the weights and the batch alone, as with the CNNs, so a resumed run continues bit-identically; contrastive
    pre-training of ViTs (MoCo v3) uses none. It has no parameters: the state dict is torchvision's."""
    for m in net.modules():
        if isinstance(m, StochasticDepth):
            m.p = 0.0
    return net


class SwinTrunk(nn.Module):
    """torchvision ``swin3d_t()`` with ``head = Identity``: (N, 3, T, H, W) -> the mean of its last-stage tokens."""

    num_layers = 12  # transformer blocks: 2 + 2 + 6 + 2

    def __init__(self):
        super().__init__()
        net = _without_drop_path(tvv.swin3d_t(weights=None))
        net.head = nn.Identity()
        self.net = net
        depths = [len(net.features[i]) for i in range(0, len(net.features), 2)]  # 2, 2, 6, 2
        self._first = [sum(depths[:i]) for i in range(len(depths))]  # block index of each stage's first block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def no_weight_decay(self) -> set[str]:
        """Position tables: each attention's relative-position bias table."""
        return {n for n, _ in self.named_parameters() if n.endswith("relative_position_bias_table")}

    def layer_id(self, name: str) -> int:
        """0: patch embedding; 1..12: the transformer blocks in order (a stage's patch merging goes with the next
        stage's first block); 13: the final LayerNorm."""
        m = re.match(r"net\.features\.(\d+)\.(\d+)\.", name)
        if m:
            stage, block = int(m[1]), int(m[2])
            if stage % 2 == 0:  # a stage of blocks
                return 1 + self._first[stage // 2] + block
        m = re.match(r"net\.features\.(\d+)\.", name)
        if m:  # patch merging between stages
            return 1 + self._first[(int(m[1]) + 1) // 2]
        return 0 if name.startswith("net.patch_embed") else self.num_layers + 1


class MViTTrunk(nn.Module):
    """torchvision ``mvit_v2_s()`` with ``head = Identity``, run at the clip's own token grid: (N, 3, T, H, W) ->
    the class token after the final LayerNorm."""

    num_layers = 16  # multiscale blocks

    def __init__(self):
        super().__init__()
        net = _without_drop_path(tvv.mvit_v2_s(weights=None))
        net.head = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        net = self.net
        x = net.conv_proj(x)
        thw = (x.shape[2], x.shape[3], x.shape[4])  # the token grid of this clip (T/2, H/4, W/4, rounded up)
        x = net.pos_encoding(x.flatten(2).transpose(1, 2))  # prepends the class token (no absolute table in v2)
        for block in net.blocks:
            x, thw = block(x, thw)
        return net.norm(x)[:, 0]

    def no_weight_decay(self) -> set[str]:
        """Position tables: the relative-position tables of every attention and the class token."""
        return {n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in
                ("rel_pos_h", "rel_pos_w", "rel_pos_t", "class_token")}

    def layer_id(self, name: str) -> int:
        """0: patch embedding and class token; 1..16: the blocks; 17: the final LayerNorm."""
        m = re.match(r"net\.blocks\.(\d+)\.", name)
        if m:
            return 1 + int(m[1])
        return 0 if name.startswith(("net.conv_proj", "net.pos_encoding")) else self.num_layers + 1
