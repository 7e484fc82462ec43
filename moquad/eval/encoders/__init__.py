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

from pathlib import Path
from typing import Any

from moquad.errors import MoquadError
from moquad.eval.encoders.contract import Clip, Encoder, Family, Framing, Loaded, Norm
from moquad.eval.encoders.hf import HF_FAMILIES, hf_config
from moquad.eval.encoders.local import LOCAL_FAMILIES, config_clip, native_clip, wrap

__all__ = ["FAMILIES", "Clip", "Encoder", "Family", "Framing", "Loaded", "Norm", "config_clip", "family_of",
           "fill_clip", "hf_config", "load_encoder", "native_clip", "parse_spec", "wrap"]

# ----------------------------------------------------------------------------- the table

FAMILIES: dict[str, Family] = {**LOCAL_FAMILIES, **HF_FAMILIES}

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
    return label or next(f for f in FAMILIES.values() if f.scheme == scheme).label(name), scheme, name


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
    """:meth:`Encoder.fill` (the name the library has long had)."""
    return encoder.fill(cfg)


def load_encoder(spec: str) -> Encoder:
    """The frozen encoder a name ``[LABEL=]NAME`` means, in eval mode: a moquad checkpoint (RUN/checkpoints/last.pt)
    or export (FILE.safetensors), ``torchvision:ARCH[:WEIGHTS]`` (random init, a weights file or the name of
    torchvision's weights) or ``hf:FOLDER_OR_HUB_NAME`` (a transformers video model: V-JEPA 2, VideoMAE,
    TimeSformer, ViViT, X-CLIP). ``enc(enc.normalize(uint8 clips (N, 3, T, H, W), device))``: pooled features
    (N, D); ``enc.tokens(...)``: the token grid; ``enc.clip``: its native clip; ``enc.record()``: what a result
    records of it."""
    label, scheme, name = parse_spec(spec)
    family, config = family_of(scheme, name)
    return Encoder(label, family, FAMILIES[family], FAMILIES[family].load(name, config), spec).eval()
