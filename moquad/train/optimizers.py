"""The optimizer table (``optimizer`` of pre-training, the linear probe and fine-tuning): ONE table, name ->
:class:`Optimizer` (how its parameter groups are made, and the torch optimizer over them), and
:func:`make_optimizer`, the one factory that reads it.

- ``lars``, ``sgd``, ``adamw``: two groups, no weight decay (nor LARS adaptation) on BatchNorm / LayerNorm /
  GroupNorm parameters and biases (:func:`moquad.train.lars.param_groups`); the CNN recipes use ``lars``.
- ``adamw_vit``: the transformer recipe (MoCo v3's ViT setting; VideoMAE's for fine-tuning): AdamW (betas 0.9,
  0.999) with no weight decay on norms, biases and position tables (a trunk's ``no_weight_decay()``, timm's
  convention: relative-position tables, the class token) nor any other 1-d parameter; when fine-tuning
  (``finetune=True``), layer-wise lr decay: a parameter of layer ``i`` of a trunk with ``L`` layers
  (``layer_id`` / ``num_layers``) learns at ``LAYER_DECAY ** (L + 1 - i)`` of the lr, everything outside the
  trunk (the new classifier) at the full lr. The schedule is the caller's (pre-training: linear warm-up then
  half-period cosine, :func:`moquad.train.schedule.lr_schedule`); it sets each group's ``lr`` every step, and
  :class:`ScaledAdamW` multiplies it by the group's ``lr_scale`` inside ``step``.

Pre-training settles its optimizer here, in one place (:func:`pretrain_optimizer`, which
:func:`moquad.settings.resolve` and the trainer apply): the optimizer a recipe or a flag names, else the backbone
row's (``moquad.models.BACKBONES``: ``lars`` for the CNNs, ``adamw_vit`` for the transformers); its lr, weight decay
and warm-up as set, else that optimizer's pre-training setting (a row's ``pretrain``, with its source). The
start-up line says which.

Adding an optimizer is one entry in :data:`OPTIMIZERS`. This module imports no torch at load time (each builder
imports its optimizer when called), so :mod:`moquad.settings` reads the names for free to check the setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moquad.config import PretrainConfig
from moquad.errors import MoquadError
from moquad.models.backbones import BACKBONES  # the backbone table imports no torch

if TYPE_CHECKING:
    import torch
    from torch import nn

# a builder: (parameter groups, lr, weight decay) -> optimizer
Builder = Callable[[list[dict], float, float], "torch.optim.Optimizer"]
# a grouping: (module, weight decay, finetune) -> parameter groups
Grouping = Callable[["nn.Module", float, bool], list[dict]]

# layer-wise lr decay of adamw_vit when fine-tuning: VideoMAE's default (run_class_finetuning.py --layer_decay 0.75)
LAYER_DECAY = 0.75


def _norm_bias_groups(module: nn.Module, weight_decay: float, finetune: bool) -> list[dict]:
    """The CNN grouping: regular weights (decay, LARS adaptation), and BN / norm / bias parameters (neither)."""
    from moquad.train.lars import param_groups

    return param_groups(module, weight_decay)


def transformer_groups(module: nn.Module, weight_decay: float, finetune: bool,
                       layer_decay: float = LAYER_DECAY) -> list[dict]:
    """``adamw_vit``'s groups: one per (weight decay, lr scale), each with ``lr_scale``. No decay: parameters of
    norm layers, biases, 1-d parameters and each trunk's ``no_weight_decay()``. ``finetune``: lr scale
    ``layer_decay ** (num_layers + 1 - layer_id(name))`` inside a trunk (a submodule with ``layer_id``), 1 outside."""
    from moquad.train.lars import _NORM_TYPES

    trunks = {prefix: m for prefix, m in module.named_modules() if hasattr(m, "layer_id")}
    norm_params = {id(p) for m in module.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters(False)}
    groups: dict[tuple[float, float], dict] = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        decay, scale = weight_decay, 1.0
        if id(p) in norm_params or p.ndim <= 1 or name.endswith("bias"):
            decay = 0.0
        for prefix, trunk in trunks.items():
            if prefix and not name.startswith(prefix + "."):
                continue
            inner = name[len(prefix) + 1:] if prefix else name
            if inner in trunk.no_weight_decay():
                decay = 0.0
            if finetune:
                scale = layer_decay ** (trunk.num_layers + 1 - trunk.layer_id(inner))
        group = groups.setdefault((decay, scale), {"params": [], "weight_decay": decay, "lr_scale": scale})
        group["params"].append(p)
    return list(groups.values())


def _lars(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """SimCLR's LARS (momentum 0.9, trust coefficient 1e-3)."""
    from moquad.train.lars import LARS

    return LARS(groups, lr=lr, momentum=0.9, weight_decay=weight_decay, eeta=1e-3)


def _sgd(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD with momentum 0.9."""
    import torch

    return torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=weight_decay)


def _adamw(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with torch's defaults otherwise."""
    import torch

    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def _scaled_adamw(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.999; eps 1e-8) whose groups learn at ``lr * lr_scale``."""
    from moquad.train.scaled_adamw import ScaledAdamW

    return ScaledAdamW(groups, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)


@dataclass(frozen=True)
class PretrainSetting:
    """An optimizer's pre-training hyper-parameters, for the ones a recipe or a flag leaves unset."""

    lr: float  # at batch 256 (scaled linearly with the global batch, moquad.train.schedule)
    weight_decay: float
    lr_warmup_epochs: float
    source: str  # where the numbers come from (the start-up line names it)


@dataclass(frozen=True)
class FinetuneSetting:
    """An optimizer's fine-tuning lr (as given, not scaled with the batch) and weight decay, for the ones a recipe or
    a flag leaves unset."""

    lr: float
    weight_decay: float
    source: str


@dataclass(frozen=True)
class Optimizer:
    """One row: how the parameters are grouped, the torch optimizer built over the groups, and its pre-training and
    fine-tuning settings (None: a run that picks it sets lr, weight decay and warm-up itself)."""

    build: Builder
    groups: Grouping = _norm_bias_groups
    pretrain: PretrainSetting | None = None
    finetune: FinetuneSetting | None = None


OPTIMIZERS: dict[str, Optimizer] = {
    # the paper's (Sec. 4.1: LARS at batch 256, lr 3.2, half-period cosine), with SimCLR's weight decay and warm-up
    # fine-tuning: the paper's (Sec. 4.1: LARS lr 0.08, batch 32, half-period cosine)
    "lars": Optimizer(_lars, pretrain=PretrainSetting(3.2, 1e-6, 10.0, "the paper's LARS setting"),
                      finetune=FinetuneSetting(0.08, 1e-4, "the paper's fine-tuning setting")),
    "sgd": Optimizer(_sgd, finetune=FinetuneSetting(0.08, 1e-4, "the paper's fine-tuning setting")),
    "adamw": Optimizer(_adamw, finetune=FinetuneSetting(1e-3, 1e-4, "torch's AdamW lr, the paper's weight decay")),
    # MoCo v3's contrastive ViT pre-training (Chen, Xie, He, ICCV 2021; facebookresearch/moco-v3 CONFIG.md);
    # fine-tuning: VideoMAE's UCF101 setting (lr 5e-4 per 256 videos at batch 128, weight decay 0.05)
    "adamw_vit": Optimizer(_scaled_adamw, transformer_groups,
                           PretrainSetting(1.5e-4, 0.1, 40.0, "MoCo v3's ViT setting"),
                           FinetuneSetting(2.5e-4, 0.05, "VideoMAE's fine-tuning setting")),
}
# the settings a PretrainSetting fills: (how the start-up line names one, how it states its value)
SETTING_KEYS = {"lr": ("lr", "lr {:g} at batch 256"), "weight_decay": ("weight decay", "weight decay {:g}"),
                "lr_warmup_epochs": ("warm-up", "{:g} warm-up epochs")}


def pretrain_optimizer(cfg: PretrainConfig) -> tuple[PretrainConfig, str]:
    """``cfg`` with its optimizer, lr, weight decay and warm-up settled (the ones left unset: the backbone row's
    optimizer and that optimizer's pre-training setting), and the start-up line that says what they are and which
    of them are the backbone's default and the optimizer's setting. Settling a settled config changes nothing."""
    name = cfg.optimizer or BACKBONES[cfg.backbone].optimizer
    unset = [k for k in SETTING_KEYS if getattr(cfg, k) is None]
    setting = OPTIMIZERS[name].pretrain
    if unset and setting is None:
        raise MoquadError(f"optimizer {name} has no pre-training setting; set {', '.join(unset)} (--set KEY=VALUE "
                          f"or a recipe), or choose one of {', '.join(n for n, o in OPTIMIZERS.items() if o.pretrain)}")
    cfg = dataclasses.replace(cfg, optimizer=name, **{k: getattr(setting, k) for k in unset})
    default = BACKBONES[cfg.backbone].optimizer
    whose = f"the {cfg.backbone} backbone's default" if name == default else \
        f"set; the {cfg.backbone} backbone's default is {default}"
    values = ", ".join(text.format(getattr(cfg, k)) for k, (_, text) in SETTING_KEYS.items())
    same = [word for k, (word, _) in SETTING_KEYS.items() if setting and getattr(cfg, k) == getattr(setting, k)]
    told = f" ({', '.join(same)}: {setting.source})" if same else ""
    return cfg, f"pretrain: optimizer {name} ({whose}), {values}{told}"


def finetune_optimizer(ft: Any, default: str, whose: str) -> tuple[Any, str]:
    """``ft`` (a :class:`moquad.config.FinetuneConfig`) with its optimizer, lr and weight decay settled (the ones
    left unset: ``default``, the optimizer row of ``whose`` (``the swin3d_t backbone``), and that optimizer's
    fine-tuning setting), and the start-up line that says what they are and where they come from."""
    name = ft.optimizer or default
    setting = OPTIMIZERS[name].finetune
    unset = [k for k in ("lr", "weight_decay") if getattr(ft, k) is None]
    if unset and setting is None:
        raise MoquadError(f"optimizer {name} has no fine-tuning setting; set {', '.join(f'finetune.{k}' for k in unset)}"
                          f" (--set KEY=VALUE or a recipe), or choose one of "
                          f"{', '.join(n for n, o in OPTIMIZERS.items() if o.finetune)}")
    ft = dataclasses.replace(ft, optimizer=name, **{k: getattr(setting, k) for k in unset})
    said = f"{whose}'s default" if name == default else f"set; {whose}'s default is {default}"
    told = f" ({', '.join(k.replace('_', ' ') for k in unset)}: {setting.source})" if unset and setting else ""
    return ft, f"finetune: optimizer {name} ({said}), lr {ft.lr:g}, weight decay {ft.weight_decay:g}{told}"


def make_optimizer(module: nn.Module, name: str, lr: float, weight_decay: float,
                   finetune: bool = False) -> torch.optim.Optimizer:
    """THE optimizer factory (pre-training, linear probe, fine-tuning) over ``module``'s trainable parameters:
    the :data:`OPTIMIZERS` row ``name``; ``finetune`` turns on a row's fine-tuning rule (``adamw_vit``: layer-wise
    lr decay)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    row = OPTIMIZERS[name]
    groups = [g for g in row.groups(module, weight_decay, finetune) if g["params"]]
    return row.build(groups, lr, weight_decay)
