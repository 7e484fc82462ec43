"""The encoder contract: what every family row states (:class:`Clip`, :class:`Framing`, :class:`Norm`), what its
loader returns (:class:`Loaded`), the row itself (:class:`Family`) and the frozen :class:`Encoder` a protocol is
handed. Nothing here names a family: the rows live in :mod:`moquad.eval.encoders.local` (moquad, torchvision) and
:mod:`moquad.eval.encoders.hf` (Hugging Face), the table in :mod:`moquad.eval.encoders`."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moquad.errors import MoquadError
from moquad.eval.clips import EVAL_DILATION

# ----------------------------------------------------------------------------- what every family states


@dataclass(frozen=True)
class Clip:
    """The clip an encoder is defined for, and which others it takes: any (``fixed_*`` False) in multiples of
    ``*_multiple`` (tubelet, patch), or exactly its own (a position table or a reshape sized by its config)."""

    frames: int
    size: int
    frame_step: int | None  # the frame step its authors evaluate at; None: not recorded for it
    fixed_frames: bool = False
    fixed_size: bool = False
    frames_multiple: int = 1
    size_multiple: int = 1
    source: str = ""
    stated: bool = True  # False: nothing states its clip (a network made by hand); the defaults stand in

    def takes(self) -> str:
        """``exactly 8 frames of exactly 32 x 32 px``, ``any multiple of 2 frames of ...``: what it accepts."""
        frames = (f"exactly {self.frames} frames" if self.fixed_frames else "any number of frames"
                  if self.frames_multiple == 1 else f"any multiple of {self.frames_multiple} frames")
        size = (f"exactly {self.size} x {self.size} px" if self.fixed_size else "any size"
                if self.size_multiple == 1 else f"any multiple of {self.size_multiple} px")
        return f"{frames} of {size}"

    def fixes(self, frames: int, size: int) -> list[str]:
        """The settings to change so the encoder takes the clip (``--frames 8``); empty when it takes it."""
        out = []
        if frames != self.frames if self.fixed_frames else frames % self.frames_multiple:
            out.append(f"--frames {self.frames}")
        if size != self.size if self.fixed_size else size % self.size_multiple:
            out.append(f"--size {self.size}")
        return out


@dataclass(frozen=True)
class Norm:
    """What the encoder's input is: ``(x / 255 - mean) / std`` per channel of RGB pixels x in 0..255, with
    ``mean`` and ``std`` read from ``source`` (a processor's affine map is stated in these terms)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    source: str

    def apply(self, x: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """uint8 or float clips (..., 3, T, H, W) in 0..255 -> float32 on ``device``, as the encoder takes them."""
        from moquad.data.augment import normalize

        return normalize(x, device, self.mean, self.std)


@dataclass(frozen=True)
class Framing:
    """How the encoder's authors frame a test view: the short side resized to ``resize`` px, then the centre
    ``crop`` x ``crop`` square (V-JEPA 2: 292 then 256; torchvision's Kinetics weights: 128 then 112; a moquad
    network: the crop size itself). At another crop size the field of view stays the same (:meth:`short_side`)."""

    resize: int
    crop: int
    source: str
    antialias: bool = True  # the resize filters first (PIL, transformers); torchvision's video weights: not
    fixed: tuple[int, int] | None = None  # the authors resize to this H x W whatever the aspect (torchvision's weights)
    # "library": the long side truncated and the centre rounded, as torchvision's resize and center_crop and
    # transformers' processors size them; "moquad": rounded and floored, moquad's own test view
    sizing: str = "library"

    def short_side(self, size: int) -> int:
        """The short side a frame is resized to before the centre ``size`` crop: ``size * resize / crop``."""
        return size if self.resize == self.crop else max(size, int(size * self.resize / self.crop))

    def resized(self, h: int, w: int, size: int) -> tuple[int, int]:
        """The (H, W) an h x w frame is resized to before the centre ``size`` crop: the short side
        :meth:`short_side`, the long side in proportion, truncated (as torchvision's ``resize`` and transformers'
        processors size it); ``fixed``: that H x W scaled to the crop."""
        if self.fixed is not None:
            return tuple(max(size, int(v * size / self.crop)) for v in self.fixed)  # type: ignore[return-value]
        short = self.short_side(size)
        if self.sizing != "library":  # moquad's own: each side scaled, rounded
            scale = short / min(h, w)
            return max(short, round(h * scale)), max(short, round(w * scale))
        return (short, max(short, int(short * w / h))) if h <= w else (max(short, int(short * h / w)), short)

    def centre(self, h: int, w: int, size: int) -> tuple[int, int]:
        """The top-left corner of the centre ``size`` square of an h x w frame."""
        if self.sizing == "library":
            return int(round((h - size) / 2)), int(round((w - size) / 2))
        return (h - size) // 2, (w - size) // 2

    def text(self, size: int) -> str:
        """``short side 292, centre crop 256``: how a result's table names it at crop ``size``."""
        return f"short side {self.short_side(size)}, centre crop {size}"


def crop_framing(size: int, source: str) -> Framing:
    """The framing that resizes the short side to the crop itself (moquad's own test view)."""
    return Framing(size, size, source, sizing="moquad")


@dataclass
class Loaded:
    """What a row's loader returns: the network, its clip, framing and normalisation, the pooled feature's size,
    facts; ``file``: the file whose sha256 is its identity (a moquad checkpoint or export), else None (the sha256 of
    its weights); ``trainable``: a fresh trainable copy of the network (fine-tuning), None: load it again;
    ``head``: a moquad checkpoint's projection head (CAM's ``projection``)."""

    net: nn.Module
    clip: Clip
    norm: Norm
    dim: int
    info: dict[str, Any] = field(default_factory=dict)
    framing: Framing | None = None  # None: the crop itself
    file: Path | None = None
    pretrained: Any = None  # a moquad checkpoint's pre-training clip (moquad.eval.clips.PretrainClip)
    config: dict[str, Any] | None = None  # a moquad checkpoint's pre-training config
    head: nn.Module | None = None


@dataclass(frozen=True)
class Family:
    """One encoder family. ``load(name, config)``: the name after the scheme (and, for ``hf``, the model's config)
    -> :class:`Loaded`; ``features(enc, x)`` / ``tokens(enc, x)``: normalised clips (N, 3, T, H, W) -> pooled (N, D)
    / token grid (N, C, t, h, w)."""

    description: str
    scheme: str  # "hf", "torchvision" or "" (a moquad file): the name's prefix that selects the row
    load: Callable[[str, Any], Loaded]
    features: Callable[[Encoder, torch.Tensor], torch.Tensor]
    tokens: Callable[[Encoder, torch.Tensor], torch.Tensor]
    pooling: str  # the pooled feature, and whose convention it is
    model_types: tuple[str, ...] = ()  # hf: the config model_types of the row
    optimizer: Callable[[Encoder], str] = lambda enc: "adamw"  # fine-tuning's default (a row of the optimizer table)
    trainable: Callable[[Encoder], nn.Module] | None = None  # fine-tuning's network; None: a copy of the encoder
    label: Callable[[str], str] = lambda name: Path(name).name  # the default label of a name after the scheme


class Encoder(nn.Module):
    """A frozen video encoder of any family: ``self(x)`` pooled features (N, D) of clips normalised by
    :meth:`normalize`; :meth:`tokens` the token grid. Weights and buffers live under ``net``."""

    def __init__(self, label: str, name: str, family: Family, loaded: Loaded, spec: str):
        super().__init__()
        self.label, self.family_name, self.family, self.spec = label, name, family, spec
        self.net = loaded.net
        self.clip, self.norm, self.out_dim, self.info = loaded.clip, loaded.norm, loaded.dim, loaded.info
        self.framing = loaded.framing or crop_framing(loaded.clip.size, "the crop itself")
        self.file, self.pretrained, self.config = loaded.file, loaded.pretrained, loaded.config
        self.parts = {"head": loaded.head}  # not a submodule: the encoder's weights are ``net``'s
        self._sha256: str | None = None

    def trainable(self) -> nn.Module:
        """A trainable copy for fine-tuning (the frozen encoder stays as loaded): its row's network (a moquad or
        torchvision trunk), else the whole encoder; either maps normalised clips to (N, D) pooled features."""
        import copy

        net = self.family.trainable(self) if self.family.trainable else copy.deepcopy(self)
        return net.requires_grad_(True).train()

    def normalize(self, x: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """uint8 clips (..., 3, T, H, W) -> the encoder's input on ``device`` (:class:`Norm`)."""
        return self.norm.apply(x, device)

    def check_clip(self, frames: int, size: int) -> None:
        """Raise the one-line error a user acts on when the encoder cannot take this clip."""
        fixes = self.clip.fixes(frames, size)
        if fixes:
            raise MoquadError(f"encoder {self.label} ({self.family.description}) takes {self.clip.takes()}, not "
                              f"{frames} frames of {size} px; pass {' '.join(fixes)}")

    def probe_clip(self, frames: int, size: int) -> None:
        """:meth:`check_clip`, then, unless the clip is the encoder's own, one forward of a blank clip: a network
        whose pooling shrinks a small clip to nothing (S3D under 5 frames or 24 px) fails here, in one line,
        before any video is decoded."""
        self.check_clip(frames, size)
        if (frames, size) == (self.clip.frames, self.clip.size):
            return
        device = next(iter(self.net.parameters()), torch.zeros(())).device
        try:
            with torch.inference_mode():
                self.family.features(self, torch.zeros(1, 3, frames, size, size, device=device))
        except RuntimeError as e:
            said = " ".join(str(e).split())[:120]
            raise MoquadError(f"encoder {self.label} ({self.family.description}) cannot take {frames} frames of "
                              f"{size} px: its layers shrink that clip to nothing ({said}); pass a larger clip, "
                              f"e.g. its own: --frames {self.clip.frames} --size {self.clip.size}") from e

    def fill(self, cfg: Any) -> Any:
        """``cfg`` (an :class:`moquad.config.EvalConfig`) with the clip settings it leaves unset (None) taken from
        the encoder's clip (the dilation: its frame step, else the paper's evaluation dilation, 2); the one-line
        error when the encoder cannot take the result."""
        cfg = dataclasses.replace(cfg, frames=cfg.frames or self.clip.frames, size=cfg.size or self.clip.size,
                                  dilation=cfg.dilation or self.clip.frame_step or EVAL_DILATION)
        self.probe_clip(cfg.frames, cfg.size)
        return cfg

    def _check(self, x: torch.Tensor) -> None:
        if x.dim() != 5 or x.shape[1] != 3 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"expected square clips shaped (N, 3, T, S, S), got {tuple(x.shape)}")
        self.check_clip(int(x.shape[2]), int(x.shape[-1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.family.features(self, x)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The token grid (N, C, t, h, w) of normalised clips (module docstring: which tokens)."""
        self._check(x)
        return self.family.tokens(self, x)

    def record(self) -> dict[str, Any]:
        """What a result records of the encoder."""
        return {"label": self.label, "spec": self.spec, "family": self.family_name,
                "description": self.family.description, "feature_dim": self.out_dim,
                "pooling": self.family.pooling, "clip": dataclasses.asdict(self.clip),
                "framing": dataclasses.asdict(self.framing), "normalize": dataclasses.asdict(self.norm), **self.info}

    def sha256(self) -> str:
        """The identity of its weights (what a feature cache and a result record): a moquad file's sha256, as a
        checkpoint's everywhere; else the sha256 of its state dict (names, dtypes, shapes, bytes, in order)."""
        if self.file is not None and Path(self.file).is_file():
            from moquad.digest import sha256_file

            return sha256_file(self.file)
        if self._sha256 is None:
            h = hashlib.sha256()
            for k, v in self.net.state_dict().items():
                v = v.detach().cpu().contiguous()
                h.update(f"{k}:{v.dtype}:{tuple(v.shape)};".encode())
                h.update(v.view(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
            self._sha256 = h.hexdigest()
        return self._sha256


