"""The backbone table: name -> everything the product knows of a backbone, in one row.

Adding a backbone is one entry in :data:`BACKBONES` (plus its module if it is new code): the
config's ``backbone`` choices, ``build_backbone``, ``moquad pretrain``'s default optimizer, ``moquad export``,
``moquad motion``'s ``ARCH:WEIGHTS`` and ``moquad cam`` all read this table. A row states what a stage needs
beyond ``build``: the feature dimension (stated here only), its native clip (what weights that carry no clip of
their own are evaluated at), its default pre-training optimizer, torchvision's key names (export), the tokens CAM
reads (transformers) and, where the definition must be told its token grid at another clip, the rule for it.

This module imports no torch at load time (each builder imports its network when called), so
:mod:`moquad.settings` reads the names for free: ``import moquad.config`` stays ~0.05 s where
``import torch`` costs ~1.7 s, and every command that never builds a network (``--help``,
``preprocess``, ``recipes``, ``info``) keeps that time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moquad.config import PretrainConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class TorchvisionNames:
    """How moquad's weights of a torchvision architecture map onto ``torchvision.models.video.<name>``."""

    prefix: str  # the prefix of moquad's backbone keys above torchvision's key names
    head: tuple[str, ...]  # torchvision's classifier keys, which the export lacks
    strip_head: str  # the code that makes the torchvision model headless, as the model card prints it


@dataclass(frozen=True)
class TokenMap:
    """Where a transformer's CAM reads its tokens: the output of submodule ``module`` of the trunk (a forward hook)
    and ``to_map``, which turns that output into a (N, C, t, h, w) map of tokens (see ``moquad.eval.cam``)."""

    module: str
    to_map: Callable[[Any], torch.Tensor]
    what: str  # said in the CAM's JSON record


@dataclass(frozen=True)
class TokenGrid:
    """A definition that must be told its token grid at a clip other than its native one (MViT's ``pos_encoding``):
    the grid of a clip, and the code that tells it (formatted with ``t``, ``h``, ``w``; the export card prints it)."""

    of: Callable[[int, int], tuple[int, int, int]]  # (frames, crop size) -> (t, h, w) tokens
    tell: str


@dataclass(frozen=True)
class Backbone:
    """One backbone: ``build()`` returns a fresh, randomly initialised trunk of ``dim``-d pooled features."""

    build: Callable[[], nn.Module]
    description: str
    dim: int  # the pooled feature's size, stated here only (build_backbone returns it; tests check the network's)
    # (frames, crop size) the architecture is defined at, or its published weights take: the clip of weights that
    # carry none of their own (torchvision's, an export without its card), in `moquad motion` and evaluation
    clip: tuple[int, int]
    optimizer: str = "lars"  # pre-training optimizer (moquad.train.optimizers.OPTIMIZERS) where none is set
    torchvision: TorchvisionNames | None = None  # None: exported under moquad's own key names only
    tokens: TokenMap | None = None  # transformers: CAM is gradient-weighted tokens; None: a CNN's pre-pool map
    grid: TokenGrid | None = None  # None: torchvision's definition runs at any clip as built


def _tiny() -> nn.Module:
    from moquad.models.nets import TinyNet

    return TinyNet()


def _r3d_18() -> nn.Module:
    import torchvision.models.video as tvv

    from moquad.models.nets import TorchvisionTrunk

    return TorchvisionTrunk(tvv.r3d_18(weights=None))


def _mc3_18() -> nn.Module:
    import torchvision.models.video as tvv

    from moquad.models.nets import TorchvisionTrunk

    return TorchvisionTrunk(tvv.mc3_18(weights=None))


def _r2plus1d_18() -> nn.Module:
    import torchvision.models.video as tvv

    from moquad.models.nets import TorchvisionTrunk

    return TorchvisionTrunk(tvv.r2plus1d_18(weights=None))


def _s3d() -> nn.Module:
    from moquad.models.nets import S3DTrunk

    return S3DTrunk()


def _r3d_50() -> nn.Module:
    from moquad.models.r3d50 import R3D50

    return R3D50()


def _swin3d_t() -> nn.Module:
    from moquad.models.transformers import SwinTrunk

    return SwinTrunk()


def _mvit_v2_s() -> nn.Module:
    from moquad.models.transformers import MViTTrunk

    return MViTTrunk()


def _channels_last(out: torch.Tensor) -> torch.Tensor:
    """Swin's normalised last-stage tokens (N, t, h, w, C) -> (N, C, t, h, w)."""
    return out.permute(0, 4, 1, 2, 3)


def _cls_and_grid(out: tuple[torch.Tensor, tuple[int, int, int]]) -> torch.Tensor:
    """An MViT block's ``(tokens (N, 1 + t*h*w, C), (t, h, w))`` -> the patch tokens (N, C, t, h, w), class
    token dropped."""
    x, (t, h, w) = out
    return x[:, 1:].reshape(x.shape[0], t, h, w, x.shape[2]).permute(0, 4, 1, 2, 3)


def _mvit_grid(frames: int, size: int) -> tuple[int, int, int]:
    """mvit_v2_s's token grid of a clip: its patch embedding strides 2 in time and 4 in space, padded."""
    return -(-frames // 2), -(-size // 4), -(-size // 4)


_FC = TorchvisionNames("net.", ("fc.weight", "fc.bias"), "model.fc = torch.nn.Identity()")
_HEAD = "model.head = torch.nn.Identity()"
_KINETICS_112 = (16, 112)  # torchvision's Kinetics-400 weights of the 18-layer CNNs: 16 frames, 112 px crops
_ADAMW_VIT = "adamw_vit"  # the transformers' optimizer (moquad.train.optimizers: MoCo v3's ViT setting)

BACKBONES: dict[str, Backbone] = {
    # the CPU demo's clip (train/cpu_demo.yaml)
    "tiny": Backbone(_tiny, "4-layer 3D CNN (~0.1 M parameters) for tests and the CPU demo", 64, (8, 32)),
    "r3d_18": Backbone(_r3d_18, "torchvision R3D-18", 512, _KINETICS_112, torchvision=_FC),
    "mc3_18": Backbone(_mc3_18, "torchvision MC3-18 (mixed 3D / 2D convolutions)", 512, _KINETICS_112,
                       torchvision=_FC),
    "r2plus1d_18": Backbone(_r2plus1d_18, "torchvision R(2+1)D-18", 512, _KINETICS_112, torchvision=_FC),
    # torchvision's S3D weights: 224 px crops (its own 2x7x7 average pool needs them), at least 14 frames
    "s3d": Backbone(_s3d, "torchvision S3D (global average pool)", 1024, (16, 224), torchvision=TorchvisionNames(
        "", ("classifier.1.weight", "classifier.1.bias"),
        "model.classifier = torch.nn.Identity(); model.avgpool = torch.nn.AdaptiveAvgPool3d(1)")),
    "r3d_50": Backbone(_r3d_50, "CVRL's 3D ResNet-50", 2048, (16, 224)),  # CVRL's clip
    # torchvision's Kinetics weights: 224 px, clip_len 32 (Swin3D_T_Weights' docs). CAM: the tokens of the last
    # stage, after its LayerNorm: exactly what the average pool reads
    "swin3d_t": Backbone(_swin3d_t, "torchvision Video Swin-T (shifted-window attention, 28 M parameters)", 768,
                         (32, 224), _ADAMW_VIT, TorchvisionNames("net.", ("head.weight", "head.bias"), _HEAD),
                         TokenMap("net.norm", _channels_last, "Swin's last-stage tokens after the final LayerNorm")),
    # built for 16 x 224 (MViT_V2_S_Weights: min_size 224, min_temporal_size 16). CAM: the feature is the class
    # token after the last block, which the last block's patch tokens never reach, so CAM reads the tokens ENTERING
    # the last block (the output of block 14 of 0..15), which its attention pools
    "mvit_v2_s": Backbone(_mvit_v2_s, "torchvision MViTv2-S (multiscale attention, class token; 35 M parameters)",
                          768, (16, 224), _ADAMW_VIT, TorchvisionNames("net.", ("head.1.weight", "head.1.bias"), _HEAD),
                          TokenMap("net.blocks.14", _cls_and_grid, "MViT's tokens entering its last block (the "
                                   "class token's attention reads them)"),
                          TokenGrid(_mvit_grid, "model.pos_encoding.temporal_size = {t}; "
                                    "model.pos_encoding.spatial_size = ({h}, {w})")),
}

# the architectures a torchvision weights file fits (``moquad export --format torchvision``, ``moquad motion
# ARCH:WEIGHTS``): the rows with torchvision names, read here once
TORCHVISION_ARCHS: tuple[str, ...] = tuple(name for name, b in BACKBONES.items() if b.torchvision is not None)


def _frame_differences(module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the clip (N, C, T, H, W) becomes its T - 1 differences ``x[t+1] - x[t]``."""
    x = args[0]
    return (x[:, :, 1:] - x[:, :, :-1], *args[1:])


# what the backbone sees of a clip: name -> (forward pre-hook or None, description). The hook sits on the
# backbone itself, so pre-training, features, fine-tuning and the export card's ``build_backbone(name, input)``
# see the same input (torchvision-named exports carry the transform as text in the card).
INPUTS: dict[str, tuple[Callable | None, str]] = {
    "rgb": (None, "the clip's normalised frames"),
    "diff": (_frame_differences, "differences of consecutive normalised frames, T - 1 of them: motion without "
                                 "the static appearance (PCL's and BE's residual-frame input)"),
}
# the INPUTS row of a call, a checkpoint or a card that names none: the config's default, stated there once
DEFAULT_INPUT: str = PretrainConfig.model_input


def build_backbone(name: str, model_input: str = DEFAULT_INPUT) -> tuple[nn.Module, int]:
    """Return ``(module, feature_dim)`` for a backbone name of ``moquad.BACKBONES`` reading ``model_input``
    (``rgb``, or ``diff``: frame differences; ``PretrainConfig.model_input``); the feature size is the row's."""
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(BACKBONES)}")
    if model_input not in INPUTS:
        raise ValueError(f"unknown model input {model_input!r}; choose one of {', '.join(INPUTS)}")
    net = BACKBONES[name].build()
    hook = INPUTS[model_input][0]
    if hook is not None:
        net.register_forward_pre_hook(hook)
    return net, BACKBONES[name].dim
