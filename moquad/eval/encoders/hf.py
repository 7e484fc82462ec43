"""The Hugging Face rows of the encoder table: a ``transformers`` video model by folder or hub name, its family the
config's ``model_type``. Each row: the model class, how its output is pooled and laid on its token grid, its native
clip, and its processor, from which the normalisation and the framing are read (never restated here). Adding a
family is one row of :data:`HF_FAMILIES` (plus its test)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moquad.errors import MoquadError
from moquad.eval.encoders.contract import Clip, Encoder, Family, Framing, Loaded, Norm


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


def _hf_processor(name: str, processor: str) -> tuple[Any, str]:
    """The model's own processor (its video or image preprocessor config; none: the library's ``processor``
    defaults), and where it came from."""
    transformers = _transformers()
    with _quiet_transformers():
        for auto in ("AutoVideoProcessor", "AutoImageProcessor"):
            try:
                proc = getattr(transformers, auto).from_pretrained(name)
                return proc, f"its {type(proc).__name__} (the preprocessor config of {name})"
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return getattr(transformers, processor)(), f"the library's {processor} defaults ({name} has no preprocessor config)"


def _hf_norm(name: str, proc: Any, source: str) -> Norm:
    """The processor read by running it on black, grey and white frames: its per-channel affine map, stated as
    mean / std (ViViT's processor, e.g., maps x to x / 127.5 - 1 before its mean 0.5 / std 0.5: mean 0.75, std
    0.25)."""
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


def _side(size: Any, key: str) -> int | None:
    """``size`` of a processor (an int, a dict or a ``SizeDict`` with ``shortest_edge`` / ``height``) -> that side."""
    if isinstance(size, int):
        return size
    get = size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)
    return get(key) or get("height")


def _hf_framing(name: str, proc: Any, source: str, clip: Clip) -> Framing:
    """The resize and centre crop of the processor (its ``size`` and ``crop_size``: V-JEPA 2 292 and 256, ViViT 256
    and 224, VideoMAE and TimeSformer 224 and 224), at the model's own crop size."""
    resize = _side(getattr(proc, "size", None), "shortest_edge") if getattr(proc, "do_resize", True) else None
    crop = _side(getattr(proc, "crop_size", None), "height") if getattr(proc, "do_center_crop", True) else None
    if not resize or not crop:
        return Framing(clip.size, clip.size, f"{source}: no resize and crop, so the crop itself")
    return Framing(int(resize), int(crop), f"{source}: short side {resize}, centre crop {crop}")


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
        proc, source = _hf_processor(name, processor)
        native = clip(config)
        return Loaded(model.eval(), native, _hf_norm(name, proc, source), dim(config), info,
                      framing=_hf_framing(name, proc, source, native))

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


# ----------------------------------------------------------------------------- the rows

HF_FAMILIES: dict[str, Family] = {
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
