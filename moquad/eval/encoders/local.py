"""The moquad and torchvision rows of the encoder table: a moquad checkpoint or export (its pre-training clip and
framing), a torchvision video model (random, a weights file or torchvision's named weights, downloaded where the
machine reaches them; clip, framing and normalisation from the weights' own transforms)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moquad.errors import MoquadError
from moquad.eval.encoders.contract import Clip, Encoder, Family, Framing, Loaded, Norm, crop_framing


def wrap(label: str, net: nn.Module, info: dict[str, Any] | None = None) -> Encoder:
    """A network made by hand (clips normalised as moquad normalises -> (N, D) features) as an encoder of the moquad
    row: the motion report's and the protocols' input; ``info``: facts it records (a moquad config's ``loader``:
    the clip it was trained at)."""
    from moquad.eval.clips import pretrain_clip

    pc = pretrain_clip(info)
    clip = Clip(pc.frames, pc.size, pc.dilation, source="a network made by hand (its clip: the config's default)",
                stated=bool(info and info.get("loader")))
    loaded = Loaded(net, clip, _moquad_norm(), 0, dict(info or {}), framing=_moquad_framing(pc.size))
    return Encoder(label, "moquad", MOQUAD, loaded, label).eval()



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
                            "step": ckpt.get("step"), "model_input": cfg.get("model_input", DEFAULT_INPUT),
                            "loader": cfg.get("loader") or {}, "clip": config_clip(cfg), "config": cfg,
                            "head": model.head.eval()}


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


def _moquad_framing(size: int) -> Framing:
    return crop_framing(size, "moquad's test view: the short side resized to the crop (moquad.eval.clips)")


def _moquad_load(name: str, _config: Any) -> Loaded:
    """A moquad checkpoint or export: moquad's own loaders, the clip it was pre-trained at, its own framing; a
    checkpoint also its pre-training clip and projection head."""
    from moquad.eval.clips import pretrain_clip
    from moquad.models import BACKBONES

    path = Path(name)
    if not path.is_file():
        raise MoquadError(f"encoder {name!r}: {path} not found; give RUN/checkpoints/last.pt, an exported "
                          ".safetensors, torchvision:ARCH[:WEIGHTS] or hf:FOLDER_OR_HUB_NAME")
    checkpoint = path.suffix != ".safetensors"
    net, info = (_checkpoint_file if checkpoint else _safetensors_file)(path)
    head, config = info.pop("head", None), info.pop("config", None)
    pc = pretrain_clip(info)
    clip = Clip(pc.frames, pc.size, pc.dilation, source="the clip it was pre-trained at (moquad.eval.clips)")
    return Loaded(net, clip, _moquad_norm(), BACKBONES[info["backbone"]].dim, {"path": str(path.resolve()), **info},
                  framing=_moquad_framing(pc.size), file=path.resolve(),
                  pretrained=pretrain_clip(config) if checkpoint else None, config=config, head=head)


def _weights_enum(arch: str) -> Any:
    import torchvision.models as tvm

    return tvm.get_model_weights(arch)


def _torchvision_clip_norm(arch: str, weights: Any) -> tuple[Clip, Norm, Framing]:
    """The clip, normalisation and framing of torchvision's weights ``weights`` of ``arch`` (their own transforms:
    ``VideoClassification(crop_size, resize_size)``, and record); the backbone row's clip, when it states one, for
    the frames."""
    from moquad.models import BACKBONES

    t = weights.transforms()
    row = BACKBONES[arch].clip
    m = re.search(r"clip_len=(\d+)", weights.meta.get("_docs", ""))
    frames = row[0] if row else int(m[1]) if m else 16
    where = f"torchvision's {type(weights).__name__}.{weights.name}"
    crop = int(t.crop_size[0])
    clip = Clip(frames, crop, None, source=f"{where} (crop size; frames: "
                f"{'the backbone row' if row else 'the clip_len it was evaluated at'})")
    framing = Framing(int(min(t.resize_size)), crop, f"{where}.transforms() (resize {list(t.resize_size)} without "
                      f"antialiasing, centre crop {crop})", antialias=False,
                      fixed=tuple(t.resize_size) if len(t.resize_size) == 2 else None)
    return clip, Norm(tuple(t.mean), tuple(t.std), f"{where}.transforms()"), framing


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
    clip, norm, framing = _torchvision_clip_norm(arch, ref)
    return Loaded(net, clip, norm, BACKBONES[arch].dim, info, framing=framing)


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


def _trunk_copy(enc: Encoder) -> nn.Module:
    """A trainable copy of the trunk (fine-tuning; a classifier saved from it loads into the same backbone)."""
    import copy

    return copy.deepcopy(enc.net)


def _backbone_optimizer(enc: Encoder) -> str:
    """Fine-tuning's default optimizer: the backbone row's (lars for the CNNs, adamw_vit for the transformers)."""
    from moquad.models import BACKBONES

    return BACKBONES[enc.info["backbone"]].optimizer


def _file_label(name: str) -> str:
    """RUN of RUN/checkpoints/last.pt, else the file's stem."""
    path = Path(name)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.stem


def _torchvision_label(name: str) -> str:
    """``ARCH``, or ``ARCH-WEIGHTS`` (the weights file's stem or torchvision's name)."""
    arch, _, weights = name.partition(":")
    return f"{arch}-{Path(weights).stem}" if weights else arch


MOQUAD = Family("a moquad checkpoint or export", "", _moquad_load, _trunk_features, _trunk_tokens,
                "the backbone's pooled feature before the projection head (global average pool; MViT: its class "
                "token), as every moquad protocol reads it", optimizer=_backbone_optimizer, trainable=_trunk_copy,
                label=_file_label)
TORCHVISION = Family("a torchvision video model", "torchvision", _torchvision_load, _trunk_features, _trunk_tokens,
                     "the network's input to its classifier (global average pool; MViT: the class token after its "
                     "final LayerNorm), torchvision's own pooling", optimizer=_backbone_optimizer,
                     trainable=_trunk_copy, label=_torchvision_label)
LOCAL_FAMILIES = {"moquad": MOQUAD, "torchvision": TORCHVISION}
