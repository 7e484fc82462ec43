"""Every video encoder by one name: the table of encoder families and what a protocol needs of each.

A name (``[LABEL=]SPEC``) is one of

- a moquad checkpoint (``RUN/checkpoints/last.pt``) or a moquad export (``FILE.safetensors``);
- ``torchvision:ARCH[:WEIGHTS]``: a torchvision video model (a row of :data:`moquad.models.BACKBONES` with torchvision
  names), randomly initialised, or with WEIGHTS: a state-dict file or the name of torchvision's own weights
  (``KINETICS400_V1``, ``DEFAULT``; downloaded by torchvision where the machine reaches it). ``ARCH:FILE`` (the
  motion report's older form) means the same as ``torchvision:ARCH:FILE``;
- ``hf:PATH_OR_NAME``: a Hugging Face ``transformers`` model: a folder ``save_pretrained`` wrote, or a hub name
  (``facebook/vjepa2-vitl-fpc64-256``) where the machine reaches the hub; its family is its config's
  ``model_type``.

Each family is ONE row of :data:`FAMILIES`, which owns all its knowledge: how to load it, its native clip (frames,
size, frame step: :class:`Clip`), its normalisation (read from the model's own processor or weights, never restated
here: :class:`Norm`), how its output is pooled to one feature per clip, and its token grid (for the attentive probe
and CAM). :func:`load_encoder` resolves a name to an :class:`Encoder`: a frozen ``nn.Module`` that maps clips
(N, 3, T, H, W), normalised by :meth:`Encoder.normalize`, to pooled features (N, D), with :meth:`Encoder.tokens` the
(N, C, t, h, w) token grid and :meth:`Encoder.check_clip` the one-line refusal of a clip it cannot take.

The pooled feature of each family, and why (the model's own classification head or paper):

- moquad / torchvision: the trunk's own pooled feature (global average pool; MViT: its class token).
- V-JEPA 2: the mean of the encoder's output tokens (after its final LayerNorm). V-JEPA 2 has no class token; its
  own video classifier (``VJEPA2ForVideoClassification``) trains an attentive pooler over exactly these tokens
  (:mod:`moquad.eval.attentive` is that probe), so the pool that needs no training is their average.
- VideoMAE: the mean of the output tokens: ``VideoMAEForVideoClassification`` (``use_mean_pooling``, the
  fine-tuning recipe of the VideoMAE paper) classifies ``fc_norm(mean of tokens)``, and ``fc_norm`` belongs to
  that head, not to the encoder. VideoMAE has no class token.
- TimeSformer: the class token after the final LayerNorm, what ``TimesformerForVideoClassification`` (and the
  TimeSformer paper's classifier) reads.
- ViViT: the class token after the final LayerNorm, what ``VivitForVideoClassification`` reads; not
  ``pooler_output`` (a BERT-style dense + tanh layer the ViViT paper does not have, which the classifier skips).
- X-CLIP: the video embedding of X-CLIP's own ``get_video_features`` (per-frame class tokens, projected, through
  its multi-frame integration transformer, averaged over frames), the video side of its video-text similarity;
  a folder holding only the vision tower (``xclip_vision_model``) gives the frame mean of its per-frame class
  tokens (``pooler_output``).

Tokens: the last layer's patch tokens (class token dropped) on their (t, h, w) grid; a CNN's feature map entering
its global pool; a moquad transformer trunk's tokens as its backbone row declares them (``TokenMap``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moquad.errors import MoquadError

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


@dataclass
class Loaded:
    """What a row's loader returns: the network, its clip and normalisation, the pooled feature's size, facts."""

    net: nn.Module
    clip: Clip
    norm: Norm
    dim: int
    info: dict[str, Any] = field(default_factory=dict)


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


class Encoder(nn.Module):
    """A frozen video encoder of any family: ``self(x)`` pooled features (N, D) of clips normalised by
    :meth:`normalize`; :meth:`tokens` the token grid. Weights and buffers live under ``net``."""

    def __init__(self, label: str, family: str, loaded: Loaded, spec: str):
        super().__init__()
        self.label, self.family_name, self.spec = label, family, spec
        self.net = loaded.net
        self.clip, self.norm, self.out_dim, self.info = loaded.clip, loaded.norm, loaded.dim, loaded.info
        self._sha256: str | None = None

    @property
    def family(self) -> Family:
        """The row of :data:`FAMILIES` this encoder comes from."""
        return FAMILIES[self.family_name]

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
                "normalize": dataclasses.asdict(self.norm), **self.info}

    def sha256(self) -> str:
        """The identity of its weights (what a feature cache and a result record): a moquad file's sha256, as a
        checkpoint's everywhere; else the sha256 of its state dict (names, dtypes, shapes, bytes, in order)."""
        if self.family_name == "moquad" and self.info.get("path") and Path(self.info["path"]).is_file():
            from moquad.digest import sha256_file

            return sha256_file(self.info["path"])
        if self._sha256 is None:
            h = hashlib.sha256()
            for k, v in self.net.state_dict().items():
                v = v.detach().cpu().contiguous()
                h.update(f"{k}:{v.dtype}:{tuple(v.shape)};".encode())
                h.update(v.view(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
            self._sha256 = h.hexdigest()
        return self._sha256


def wrap(label: str, net: nn.Module, info: dict[str, Any] | None = None) -> Encoder:
    """A network made by hand (clips normalised as moquad normalises -> (N, D) features) as an encoder of the moquad
    row: the motion report's and the protocols' input; ``info``: facts it records (a moquad config's ``loader``:
    the clip it was trained at)."""
    from moquad.eval.clips import pretrain_clip

    pc = pretrain_clip(info)
    clip = Clip(pc.frames, pc.size, pc.dilation, source="a network made by hand (its clip: the config's default)")
    return Encoder(label, "moquad", Loaded(net, clip, _moquad_norm(), 0, dict(info or {})), label).eval()


# ----------------------------------------------------------------------------- moquad and torchvision rows


def config_clip(config: dict[str, Any]) -> dict[str, Any]:
    """``info["clip"]`` of weights with a moquad config (a checkpoint's, an export's card): its pre-training clip."""
    from moquad.eval.clips import pretrain_clip

    clip = pretrain_clip(config)
    return {"frames": clip.frames, "size": clip.size, "dilations": list(clip.dilations), "from": "pre-training"}


def native_clip(arch: str) -> dict[str, Any]:
    """``info["clip"]`` of weights that carry no clip (torchvision's, an export without its card): the native clip
    of their backbone row (``moquad.models.BACKBONES``), e.g. 16 x 224 for mvit_v2_s."""
    from moquad.models import BACKBONES

    frames, size = BACKBONES[arch].clip
    return {"frames": frames, "size": size, "dilations": None, "from": f"the {arch} row's native clip"}


def _into_backbone(arch: str, sd: dict[str, torch.Tensor], torchvision_names: bool, model_input: str,
                   path: Path) -> nn.Module:
    """moquad's ``build_backbone(arch, model_input)`` with ``sd`` loaded strictly (torchvision's classifier keys,
    absent from moquad's trunk, are dropped; their names come from the backbone table)."""
    from moquad.models import BACKBONES, build_backbone

    net, _ = build_backbone(arch, model_input)
    names = BACKBONES[arch].torchvision
    if torchvision_names and names is not None:
        sd = {names.prefix + k: v for k, v in sd.items() if k not in names.head}
    try:
        net.load_state_dict(sd)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:200]
        raise MoquadError(f"{path}: its weights do not fit torchvision's / moquad's {arch}: {detail}") from e
    return net


def _checkpoint_file(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """A ``moquad pretrain`` checkpoint (RUN/checkpoints/last.pt): its backbone."""
    from moquad.models.backbones import DEFAULT_INPUT
    from moquad.models.checkpoint import load_model

    model, ckpt = load_model(path)
    cfg = ckpt["config"]
    return model.backbone, {"backbone": cfg["backbone"], "method": cfg.get("method"), "epoch": ckpt.get("epoch"),
                            "model_input": cfg.get("model_input", DEFAULT_INPUT), "loader": cfg.get("loader") or {},
                            "clip": config_clip(cfg)}


def _safetensors_file(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """A ``moquad export --format safetensors`` file; the architecture from its metadata, the input from its card."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from moquad.models.backbones import BACKBONES, DEFAULT_INPUT

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        sd = load_file(str(path))
    except Exception as e:  # any parse failure of a user-supplied file
        raise MoquadError(f"{path} is not a readable safetensors file ({type(e).__name__}); re-run moquad export") from e
    arch = meta.get("architecture")
    if arch not in BACKBONES:
        raise MoquadError(f"{path} names no known architecture ({arch!r}); re-export it with moquad export "
                          "--format safetensors")
    card = path.with_suffix(".json")
    cfg = json.loads(card.read_text()).get("pretrain_config", {}) if card.is_file() else {}
    model_input = cfg.get("model_input", DEFAULT_INPUT)
    net = _into_backbone(arch, sd, BACKBONES[arch].torchvision is not None, model_input, path)
    return net, {"backbone": arch, "method": cfg.get("method"), "model_input": model_input,
                 "loader": cfg.get("loader") or {}, "card": str(card) if card.is_file() else None,
                 "clip": config_clip(cfg) if cfg else native_clip(arch)}


def _torchvision_file(path: Path, arch: str) -> tuple[nn.Module, dict[str, Any]]:
    """A state dict of ``torchvision.models.video.<arch>`` (with or without its classifier), e.g. torchvision's
    Kinetics weights or ``moquad export --format torchvision``."""
    from moquad.models.checkpoint import load

    sd = load(path, require=())
    sd = sd.get("state_dict", sd) if isinstance(sd.get("state_dict"), dict) else sd
    return _into_backbone(arch, sd, True, "rgb", path), {"backbone": arch, "method": "torchvision weights",
                                                         "clip": native_clip(arch)}


def _moquad_norm() -> Norm:
    from moquad.data.augment import MEAN, STD

    return Norm(MEAN, STD, "moquad.data.augment (the normalisation moquad pre-trains with)")


def _moquad_load(name: str, _config: Any) -> Loaded:
    """A moquad checkpoint or export: moquad's own loaders (the motion report's), the clip it was pre-trained at."""
    from moquad.eval.clips import pretrain_clip
    from moquad.models import BACKBONES

    path = Path(name)
    if not path.is_file():
        raise MoquadError(f"encoder {name!r}: {path} not found; give RUN/checkpoints/last.pt, an exported "
                          ".safetensors, torchvision:ARCH[:WEIGHTS] or hf:FOLDER_OR_HUB_NAME")
    net, info = (_safetensors_file if path.suffix == ".safetensors" else _checkpoint_file)(path)
    pc = pretrain_clip(info)
    clip = Clip(pc.frames, pc.size, pc.dilation, source="the clip it was pre-trained at (moquad.eval.clips)")
    return Loaded(net, clip, _moquad_norm(), BACKBONES[info["backbone"]].dim, {"path": str(path.resolve()), **info})


def _weights_enum(arch: str) -> Any:
    import torchvision.models as tvm

    return tvm.get_model_weights(arch)


def _torchvision_clip_norm(arch: str, weights: Any) -> tuple[Clip, Norm]:
    """The clip and normalisation of torchvision's weights ``weights`` of ``arch`` (their own transforms and
    record); the backbone row's clip, when it states one, for the frames."""
    from moquad.models import BACKBONES

    t = weights.transforms()
    row = BACKBONES[arch].clip
    m = re.search(r"clip_len=(\d+)", weights.meta.get("_docs", ""))
    frames = row[0] if row else int(m[1]) if m else 16
    where = f"torchvision's {type(weights).__name__}.{weights.name}"
    clip = Clip(frames, int(t.crop_size[0]), None, source=f"{where} (crop size; frames: "
                f"{'the backbone row' if row else 'the clip_len it was evaluated at'})")
    return clip, Norm(tuple(t.mean), tuple(t.std), f"{where}.transforms()")


def _torchvision_load(name: str, _config: Any) -> Loaded:
    """``ARCH[:WEIGHTS]``: moquad's trunk of a torchvision video model, random or with weights (file or name)."""
    from moquad.models import BACKBONES, build_backbone
    from moquad.models.backbones import TORCHVISION_ARCHS

    arch, _, weights = name.partition(":")
    if arch not in TORCHVISION_ARCHS:
        raise MoquadError(f"torchvision:{name}: {arch!r} is not a torchvision video model moquad reads; choose one of "
                          f"{', '.join(TORCHVISION_ARCHS)}")
    enum = _weights_enum(arch)
    named = weights in enum.__members__ or weights == "DEFAULT"
    ref = enum[weights] if weights in enum.__members__ else enum.DEFAULT
    if not weights:
        with torch.random.fork_rng():  # the same network at every load (features cached, compared, reported)
            torch.manual_seed(0)
            net, _ = build_backbone(arch)
        info: dict[str, Any] = {"backbone": arch, "weights": "random init (seed 0)"}
    elif named:
        net, info = _torchvision_file(_download(arch, ref), arch)
        info["weights"] = f"{type(ref).__name__}.{ref.name}"
    elif Path(weights).is_file():
        net, info = _torchvision_file(Path(weights), arch)
        info["weights"] = str(Path(weights).resolve())
    else:
        known = ", ".join([w.name for w in enum] + ["DEFAULT"])
        raise MoquadError(f"torchvision:{name}: {weights} is neither a file nor a name of torchvision's {arch} "
                          f"weights ({known})")
    clip, norm = _torchvision_clip_norm(arch, ref)
    return Loaded(net, clip, norm, BACKBONES[arch].dim, info)


def _download(arch: str, weights: Any) -> Path:
    """torchvision's weights file in torch's hub cache (downloaded once, where the machine reaches it)."""
    import contextlib
    import io
    import sys

    from torch.hub import get_dir, load_state_dict_from_url

    said = io.StringIO()  # torch's "Downloading: ..." line: shown once the file is here, never before a failure
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            load_state_dict_from_url(weights.url, progress=False, check_hash=True)
        sys.stderr.write(said.getvalue())
    except (OSError, RuntimeError) as e:  # no network, a proxy, a truncated file
        raise MoquadError(f"torchvision:{arch}:{weights.name}: cannot download {weights.url} ({type(e).__name__}); "
                          f"download it where the network is reachable and pass torchvision:{arch}:FILE.pth") from e
    return Path(get_dir()) / "checkpoints" / Path(weights.url).name


def _trunk_features(enc: Encoder, x: torch.Tensor) -> torch.Tensor:
    return enc.net(x)


def _trunk_tokens(enc: Encoder, x: torch.Tensor) -> torch.Tensor:
    """A moquad trunk's tokens: the token map its backbone row declares (transformers), else the CNN's feature map
    entering its global pool (CAM's reading of both)."""
    from moquad.models import BACKBONES
    from moquad.models.hooks import pool_input, token_output

    tokens = BACKBONES[enc.info["backbone"]].tokens
    if tokens is None:
        return pool_input(enc.net, x)
    return tokens.to_map(token_output(enc.net, tokens, x)[1])


# ----------------------------------------------------------------------------- Hugging Face rows


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise MoquadError("hf: encoders need the transformers package (moquad's hf extra); in a clone of moquad run "
                          "pip install -e '.[hf]' (or make setup: every extra from the lock)") from e
    return transformers


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and load reports off while moquad loads (a failure is reported by moquad)."""
    import logging

    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hub = logging.getLogger("huggingface_hub")  # its retry warnings
    hub_level = hub.level
    hub.setLevel(logging.ERROR)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hub.setLevel(hub_level)
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def hf_config(name: str) -> Any:
    """The ``transformers`` config of ``hf:NAME`` (a save_pretrained folder or a hub name), or the one-line error."""
    transformers = _transformers()
    path = Path(name)
    if path.exists() and not path.is_dir():
        raise MoquadError(f"hf:{name} is a file; give the folder save_pretrained wrote (config.json + weights)")
    if path.is_dir() and not (path / "config.json").is_file():
        raise MoquadError(f"hf:{name} has no config.json; give a folder written by save_pretrained (config.json + "
                          "model.safetensors) or a hub name ORG/MODEL")
    if not path.exists() and (not re.fullmatch(r"[\w.-]+/[\w.-]+", name) or path.parent.is_dir()):
        raise MoquadError(f"hf:{name}: no such folder" + (f" in {path.parent}" if path.parent.is_dir() else
                                                           ", and not a hub name (ORG/MODEL)"))
    download = f"download it where the hub is reachable (hf download {name} --local-dir DIR) and pass hf:DIR"
    if not path.exists() and not _hub_reachable():
        raise MoquadError(f"hf:{name}: the Hugging Face hub is not reachable from this machine; {download}")
    try:
        with _quiet_transformers():
            return transformers.AutoConfig.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        said = " ".join(str(e).split()).split(". ")[0][:160]  # its first sentence
        hint = download if not path.exists() else "re-save it with save_pretrained"
        raise MoquadError(f"hf:{name}: cannot read its config ({said}); {hint}") from e


def _hub_reachable() -> bool:
    """Whether the hub's host resolves (no network: transformers would retry for half a minute, then fail);
    ``HF_HUB_OFFLINE`` set: not reachable."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _hf_norm(name: str, processor: str) -> Norm:
    """The model's own processor (its video or image preprocessor config; none: the library's ``processor``
    defaults), read by running it on black, grey and white frames: its per-channel affine map, stated as mean / std
    (ViViT's processor, e.g., maps x to x / 127.5 - 1 before its mean 0.5 / std 0.5: mean 0.75, std 0.25)."""
    transformers = _transformers()
    proc, source = None, ""
    with _quiet_transformers():
        for auto in ("AutoVideoProcessor", "AutoImageProcessor"):
            try:
                proc = getattr(transformers, auto).from_pretrained(name)
                source = f"its {type(proc).__name__} (the preprocessor config of {name})"
                break
            except (OSError, ValueError, KeyError, TypeError):
                continue
    if proc is None:
        proc = getattr(transformers, processor)()
        source = f"the library's {processor} defaults ({name} has no preprocessor config)"
    levels = torch.tensor([0, 128, 255], dtype=torch.uint8).view(3, 1, 1, 1).expand(3, 3, 16, 16).contiguous()
    kw = {"return_tensors": "pt", "do_resize": False, "do_center_crop": False}
    out = (proc(videos=[levels], **kw) if "Video" in type(proc).__name__ else proc(images=list(levels), **kw))
    y = next(v for v in out.values() if torch.is_tensor(v)).reshape(3, 3, -1)[..., 0].double()  # (level, channel)
    slope = (y[2] - y[0]) / 255
    if not torch.allclose(y[1], y[0] + 128 * slope, atol=1e-4) or (slope <= 0).any():
        raise MoquadError(f"hf:{name}: its processor {type(proc).__name__} is not a per-channel affine map of the "
                          "pixels; moquad cannot apply it to its clips")
    std = (1 / (255 * slope)).tolist()
    mean = (-y[0] / (255 * slope)).tolist()
    return Norm(tuple(round(v, 7) for v in mean), tuple(round(v, 7) for v in std), source)


def _hf_loader(classes: dict[str, str], clip: Callable[[Any], Clip], dim: Callable[[Any], int], processor: str,
               skip: tuple[str, ...] = ()) -> Callable[[str, Any], Loaded]:
    """A row's loader: the config's model class, strict about weights (a tensor missing or of another shape is
    the one-line error; ``skip``: parts the encoder never runs, e.g. V-JEPA 2's predictor), eval mode."""
    def load(name: str, config: Any) -> Loaded:
        transformers = _transformers()
        cls = getattr(transformers, classes[config.model_type])
        try:
            with _quiet_transformers():
                model, report = cls.from_pretrained(name, output_loading_info=True)
        except (OSError, RuntimeError, ValueError) as e:
            raise MoquadError(f"hf:{name}: its weights do not load into {cls.__name__} "
                              f"({' '.join(str(e).split())[:160]}); give weights saved from this architecture "
                              "with save_pretrained") from e
        missing = sorted(k for k in report["missing_keys"] if not k.startswith(skip))
        if missing or report["mismatched_keys"]:
            bad = missing or sorted(str(k) for k in report["mismatched_keys"])
            raise MoquadError(f"hf:{name}: its weights do not fit {cls.__name__} as its config describes it "
                              f"({len(bad)} tensors missing or of another shape, e.g. {bad[0]}); give the folder "
                              "save_pretrained wrote for this model")
        info = {"path": str(Path(name).resolve()) if Path(name).is_dir() else name, "class": cls.__name__,
                "model_type": config.model_type}
        return Loaded(model.eval(), clip(config), _hf_norm(name, processor), dim(config), info)

    return load


def _hf_family(description: str, classes: dict[str, str], run: Callable[[nn.Module, torch.Tensor], Any],
               pool: Callable[[Any, int], torch.Tensor], grid: Callable[[Any, Any, tuple[int, ...]], torch.Tensor],
               clip: Callable[[Any], Clip], dim: Callable[[Any], int], processor: str, pooling: str,
               skip: tuple[str, ...] = ()) -> Family:
    """A row for a ``transformers`` video model. ``run(model, pixels (B, T, C, H, W))`` -> its output;
    ``pool(output, B)`` -> (B, D); ``grid(output, config, (B, T, H, W))`` -> (B, C, t, h, w)."""
    def features(enc: Encoder, x: torch.Tensor) -> torch.Tensor:
        return pool(run(enc.net, x.transpose(1, 2)), x.shape[0])

    def tokens(enc: Encoder, x: torch.Tensor) -> torch.Tensor:
        b, _, t, h, w = x.shape
        return grid(run(enc.net, x.transpose(1, 2)), enc.net.config, (b, t, h, w))

    return Family(description, "hf", _hf_loader(classes, clip, dim, processor, skip), features, tokens, pooling,
                  tuple(classes))


def _to_grid(tok: torch.Tensor, shape: Sequence[int], order: str = "thwc") -> torch.Tensor:
    """Flat tokens (B, L, C) in ``order`` over the grid ``shape`` (t, h, w) -> (B, C, t, h, w)."""
    t, h, w = shape
    sizes = {"t": t, "h": h, "w": w, "c": tok.shape[-1]}
    g = tok.reshape(tok.shape[0], *(sizes[a] for a in order))
    return g.permute(0, *(1 + order.index(a) for a in "cthw"))


def _patch(size: Any) -> int:
    return int(size[0] if isinstance(size, (list, tuple)) else size)


# V-JEPA 2: RoPE positions computed from crop_size (any other size gives wrong positions, silently), any frame count
def _vjepa2_clip(c: Any) -> Clip:
    return Clip(c.frames_per_clip, c.crop_size, 4, fixed_size=True, frames_multiple=c.tubelet_size,
                size_multiple=_patch(c.patch_size), source="its config (frames_per_clip, crop_size); frame step 4: "
                "V-JEPA 2's SSv2 / K400 probes (configs/eval/vitl)")


def _vjepa2_grid(out: Any, c: Any, s: Sequence[int]) -> torch.Tensor:
    p = _patch(c.patch_size)
    return _to_grid(out.last_hidden_state, (s[1] // c.tubelet_size, s[2] // p, s[3] // p))


# VideoMAE: a fixed sin-cos table of num_frames / tubelet x (image_size / patch)^2 positions
def _videomae_clip(c: Any) -> Clip:
    return Clip(c.num_frames, c.image_size, 4, fixed_frames=True, fixed_size=True, source="its config (num_frames, "
                "image_size); frame step 4: VideoMAE's Kinetics-400 clip (16 frames at stride 4)")


def _videomae_grid(out: Any, c: Any, s: Sequence[int]) -> torch.Tensor:
    p = _patch(c.patch_size)
    return _to_grid(out.last_hidden_state, (s[1] // c.tubelet_size, s[2] // p, s[3] // p))


# TimeSformer: its layers reshape tokens by the config's num_frames and image_size
def _timesformer_run(model: nn.Module, pixels: torch.Tensor) -> Any:
    if model.config.attention_type == "space_only":
        raise MoquadError("TimeSformer with attention_type space_only classifies each frame on its own; moquad "
                          "reads the video models (divided_space_time or joint_space_time)")
    return model(pixels)


def _timesformer_clip(c: Any) -> Clip:
    return Clip(c.num_frames, c.image_size, 32, fixed_frames=True, fixed_size=True, source="its config "
                "(num_frames, image_size); frame step 32: TimeSformer's 8-frame clips sampled at rate 1/32")


def _timesformer_grid(out: Any, c: Any, s: Sequence[int]) -> torch.Tensor:
    p = _patch(c.patch_size)
    return _to_grid(out.last_hidden_state[:, 1:], (s[1], s[2] // p, s[3] // p), "hwtc")  # patch-major, frame last


# ViViT: a fixed position table (num_frames / tubelet x grid); its spatial interpolation is not used
def _vivit_clip(c: Any) -> Clip:
    return Clip(c.num_frames, c.image_size, 2, fixed_frames=True, fixed_size=True, source="its config (num_frames, "
                "image_size); frame step 2: ViViT's Kinetics clips (32 frames at stride 2)")


def _vivit_grid(out: Any, c: Any, s: Sequence[int]) -> torch.Tensor:
    tt, ph, pw = c.tubelet_size
    return _to_grid(out.last_hidden_state[:, 1:], (s[1] // tt, s[2] // ph, s[3] // pw))


# X-CLIP: each layer's cross-frame messages group the batch by the config's num_frames; fixed position tables
def _xclip_vision(c: Any) -> Any:
    return getattr(c, "vision_config", c)


def _xclip_run(model: nn.Module, pixels: torch.Tensor) -> Any:
    if hasattr(model, "get_video_features"):  # the whole X-CLIP: its own video embedding
        return model.get_video_features(pixels)
    return model(pixels.flatten(0, 1))  # the vision tower alone: per-frame outputs


def _xclip_pool(out: Any, b: int) -> torch.Tensor:
    pooled = out.pooler_output
    return pooled if len(pooled) == b else pooled.reshape(b, -1, pooled.shape[-1]).mean(1)


def _xclip_clip(c: Any) -> Clip:
    v = _xclip_vision(c)
    return Clip(v.num_frames, v.image_size, None, fixed_frames=True, fixed_size=True, source="its vision config "
                "(num_frames, image_size); X-CLIP samples one frame per segment (no fixed step)")


def _xclip_grid(out: Any, c: Any, s: Sequence[int]) -> torch.Tensor:
    p = _patch(_xclip_vision(c).patch_size)
    tok = out.last_hidden_state[:, 1:]  # (B * T, h * w, C): per-frame patch tokens
    return _to_grid(tok.reshape(s[0], s[1] * tok.shape[1], tok.shape[2]), (s[1], s[2] // p, s[3] // p))


def _cls(out: Any, _b: int) -> torch.Tensor:
    return out.last_hidden_state[:, 0]


def _mean(out: Any, _b: int) -> torch.Tensor:
    return out.last_hidden_state.mean(1)


def _call(model: nn.Module, pixels: torch.Tensor) -> Any:
    return model(pixels)


def _hidden(c: Any) -> int:
    return int(c.hidden_size)


# ----------------------------------------------------------------------------- the table

FAMILIES: dict[str, Family] = {
    "moquad": Family("a moquad checkpoint or export", "", _moquad_load, _trunk_features, _trunk_tokens,
                     "the backbone's pooled feature before the projection head (global average pool; MViT: its "
                     "class token), as every moquad protocol reads it"),
    "torchvision": Family("a torchvision video model", "torchvision", _torchvision_load, _trunk_features,
                          _trunk_tokens, "the network's input to its classifier (global average pool; MViT: the class "
                          "token after its final LayerNorm), torchvision's own pooling"),
    "vjepa2": _hf_family("V-JEPA 2", {"vjepa2": "VJEPA2Model"}, lambda m, p: m(p, skip_predictor=True), _mean,
                         _vjepa2_grid, _vjepa2_clip, _hidden, "VJEPA2VideoProcessor",
                         "mean of the output tokens (no class token; V-JEPA 2 probes these tokens attentively)",
                         skip=("predictor.",)),
    "videomae": _hf_family("VideoMAE", {"videomae": "VideoMAEModel"}, _call, _mean, _videomae_grid, _videomae_clip,
                           _hidden, "VideoMAEVideoProcessor",
                           "mean of the output tokens (VideoMAEForVideoClassification's mean pooling, before its "
                           "fc_norm)"),
    "timesformer": _hf_family("TimeSformer", {"timesformer": "TimesformerModel"}, _timesformer_run, _cls,
                              _timesformer_grid, _timesformer_clip, _hidden, "TimesformerVideoProcessor",
                              "the class token after the final LayerNorm (TimesformerForVideoClassification's input)"),
    "vivit": _hf_family("ViViT", {"vivit": "VivitModel"}, _call, _cls, _vivit_grid, _vivit_clip, _hidden,
                        "VivitVideoProcessor", "the class token after the final LayerNorm "
                        "(VivitForVideoClassification's input; not pooler_output)"),
    "xclip": _hf_family("X-CLIP (video encoder)", {"xclip": "XCLIPModel", "xclip_vision_model": "XCLIPVisionModel"},
                        _xclip_run, _xclip_pool, _xclip_grid, _xclip_clip,
                        lambda c: int(getattr(c, "projection_dim", None) or c.hidden_size), "CLIPImageProcessor",
                        "X-CLIP's video embedding (get_video_features: projected frame class tokens through its "
                        "multi-frame integration transformer, frame mean); vision tower alone: the frame mean of "
                        "its class tokens"),
}


# ----------------------------------------------------------------------------- names -> encoders


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``[LABEL=]NAME`` -> (label, scheme, name after the scheme). ``ARCH:FILE`` with ARCH a torchvision video model is
    ``torchvision:ARCH:FILE``. Default label: the hf folder's or hub model's name, ``ARCH`` (``ARCH-WEIGHTS``), the run
    folder's name (RUN/checkpoints/last.pt) or the file's stem."""
    from moquad.models.backbones import TORCHVISION_ARCHS

    label, _, rest = spec.rpartition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
    scheme, _, name = rest.partition(":")
    if scheme in TORCHVISION_ARCHS:
        scheme, name = "torchvision", rest
    elif scheme not in {f.scheme for f in FAMILIES.values()} or not name:
        scheme, name = "", rest
    return label or _default_label(scheme, name), scheme, name


def _default_label(scheme: str, name: str) -> str:
    if scheme == "hf":
        return Path(name).name
    if scheme == "torchvision":
        arch, _, weights = name.partition(":")
        return f"{arch}-{Path(weights).stem}" if weights else arch
    path = Path(name)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.stem


def family_of(scheme: str, name: str) -> tuple[str, Any]:
    """The row of :data:`FAMILIES` a parsed name belongs to (hf: by its config's model_type), and that config."""
    if scheme != "hf":
        return next(k for k, f in FAMILIES.items() if f.scheme == scheme), None
    config = hf_config(name)
    found = [k for k, f in FAMILIES.items() if config.model_type in f.model_types]
    if not found:
        known = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
        raise MoquadError(f"hf:{name} is a {config.model_type!r} model, not one of the video encoders moquad reads "
                          f"({known}); give a video model's folder or hub name")
    return found[0], config


def fill_clip(cfg: Any, encoder: Encoder) -> Any:
    """``cfg`` (an :class:`moquad.config.EvalConfig`) with the clip settings it leaves unset (None) taken from the
    encoder's native clip (the dilation: its frame step, else the paper's evaluation dilation); the one-line error
    when the encoder cannot take the result."""
    from moquad.eval.clips import EVAL_DILATION

    clip = encoder.clip
    cfg = dataclasses.replace(cfg, frames=cfg.frames or clip.frames, size=cfg.size or clip.size,
                              dilation=cfg.dilation or clip.frame_step or EVAL_DILATION)
    encoder.probe_clip(cfg.frames, cfg.size)
    return cfg


def load_encoder(spec: str) -> Encoder:
    """The frozen encoder a name ``[LABEL=]NAME`` means, in eval mode: a moquad checkpoint (RUN/checkpoints/last.pt)
    or export (FILE.safetensors), ``torchvision:ARCH[:WEIGHTS]`` (random init, a weights file or the name of
    torchvision's weights) or ``hf:FOLDER_OR_HUB_NAME`` (a transformers video model: V-JEPA 2, VideoMAE,
    TimeSformer, ViViT, X-CLIP). ``enc(enc.normalize(uint8 clips (N, 3, T, H, W), device))``: pooled features
    (N, D); ``enc.tokens(...)``: the token grid; ``enc.clip``: its native clip; ``enc.record()``: what a result
    records of it."""
    label, scheme, name = parse_spec(spec)
    family, config = family_of(scheme, name)
    loaded = FAMILIES[family].load(name, config)
    return Encoder(label, family, loaded, spec).eval()
