"""What a trunk computes on the way to its pooled feature, read with forward hooks: a CNN's feature map entering its
global pool, a transformer's tokens where its backbone row says (:class:`moquad.models.backbones.TokenMap`). The CAM,
the attentive probe and the encoder table read both here, once."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from moquad.models.backbones import TokenMap


def pool_input(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Run ``net`` on ``x`` and return the feature map entering its last ``AdaptiveAvgPool3d`` (N, C, t, h, w)."""
    pools = [m for m in net.modules() if isinstance(m, nn.AdaptiveAvgPool3d)]
    if not pools:
        raise ValueError(f"{type(net).__name__} has no AdaptiveAvgPool3d; CAM needs the pre-pool feature map")
    seen: list[torch.Tensor] = []
    handle = pools[-1].register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
    try:
        net(x)
    finally:
        handle.remove()
    return seen[-1]


def tensor_of(out: Any) -> torch.Tensor:
    """The tensor of a hooked module's output (MViT blocks return ``(tokens, thw)``)."""
    return out[0] if isinstance(out, tuple) else out


def token_output(net: nn.Module, tokens: TokenMap, x: torch.Tensor, *, grad: bool = False) -> tuple[Any, Any]:
    """``(net(x), the output of tokens.module)``; ``tokens.to_map`` of the second is the (N, C, t, h, w) token map.
    ``grad``: the tokens start a graph of their own where the weights are frozen, so a score of ``net(x)`` can be
    differentiated with respect to them (Grad-CAM)."""
    seen: list[Any] = []

    def keep(_m: nn.Module, _i: Any, out: Any) -> Any:
        t = tensor_of(out)
        if grad and not t.requires_grad:  # frozen weights: the tokens start the graph themselves
            t = t.detach().requires_grad_()
            out = (t, *out[1:]) if isinstance(out, tuple) else t
        seen.append(out)
        return out

    handle = net.get_submodule(tokens.module).register_forward_hook(keep)
    try:
        y = net(x)
    finally:
        handle.remove()
    return y, seen[-1]
