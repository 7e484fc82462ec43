"""Class-activation maps over a video's frames, drawn as an image strip (the paper's Fig. 5).

The encoder: any name of the encoder table (a moquad checkpoint or export, ``torchvision:ARCH[:WEIGHTS]``,
``hf:NAME``), resolved once by the command. The clip: ``cfg.frames`` frames at ``cfg.dilation`` from the middle
of the video, framed as the encoder's family frames it (:class:`moquad.eval.encoders.Framing`), centre crop
``cfg.size``. The map is computed on a CNN trunk's last feature map (the input of its global average pool, found
as the last ``AdaptiveAvgPool3d``), or on another encoder's token grid (:meth:`Encoder.tokens`, as the attentive
probe reads it), then upsampled (trilinear) to the clip and min-max scaled to [0, 1] over the whole clip.
``auto`` falls back to ``norm`` for an encoder without a projection head (torchvision, Hugging Face).

Activation (``method``):

- ``classifier`` -- CAM of Zhou et al. 2016: ``sum_c w[pred, c] * F[c, t, h, w]`` with the
  weights of a fine-tuned classifier (``finetune_model.pt`` of ``moquad finetune``); used by
  ``auto`` when that file exists in the output folder and was fine-tuned from this
  checkpoint, or when ``classifier=`` names it.
- ``projection`` -- for a self-supervised backbone without classifier: each location's
  feature goes through the projection head and is compared (cosine) with the projection of
  the pooled clip feature, i.e. where the clip's contrastive embedding "comes from". ``auto``
  falls back to it.
- ``norm`` -- the L2 norm of the feature at each location (a classifier-free saliency).

Transformers (a backbone row with ``tokens``, :class:`moquad.models.backbones.TokenMap`: swin3d_t, mvit_v2_s) have
no convolutional map whose channels the pooled feature averages, so each method names a score ``s`` instead and
the map is the gradient-weighted tokens (Grad-CAM's per-location form): ``relu(sum_c A[c, t, h, w] * ds/dA[c, t,
h, w])`` over the (t', h', w') token grid the row declares (Swin: the last stage after its LayerNorm; MViT: the
tokens entering its last block, which the class token attends to), i.e. each token's first-order contribution to
``s``. ``s``: ``classifier`` the predicted class's logit; ``projection`` the length of the clip's projection along
its own direction (``z . stopgrad(z / |z|)``: where the contrastive embedding comes from); ``norm`` the length of
the pooled feature. A token the score does not depend on gets 0.

One clip, so it runs on CPU whatever ``cfg.device`` says. A JSON with the source video,
method, prediction, config and checkpoint hash is written beside the PNG.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from moquad.config import EvalConfig, to_dict
from moquad.data.clip_frames import uniform_clips
from moquad.data.store import Split
from moquad.data.video_file import decode_frames, unreadable
from moquad.digest import sha256_file
from moquad.eval.clips import spatial_crops
from moquad.eval.common import eval_folder, need_encoder, with_clip
from moquad.eval.encoders import Encoder
from moquad.eval.finetune import load_classifier
from moquad.io import atomic_write_text
from moquad.models.backbones import BACKBONES, TokenMap
from moquad.models.hooks import pool_input, tensor_of, token_output
from moquad.record import environment

METHODS = ("auto", "classifier", "projection", "norm")


def _decode_clip(path: Path, frames: int, dilation: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The middle clip of a raw video file -> (its frames (T, H, W, 3) at the file's own size, their indices, the
    video's frame count). Two decodes: one counts the frames, one keeps the clip's, so the encoder's framing
    resizes them from the source as its authors' processor does (no frame is shrunk first). A file that is not a
    readable video: the one-line error (:mod:`moquad.data.video_file`)."""
    none = np.zeros((1, 1, 3), np.uint8)
    count = len(decode_frames(path, lambda _f: none))
    idx = uniform_clips(count, frames, dilation, 1)[0]
    wanted, kept, seen = set(idx.tolist()), {}, iter(range(count))

    def keep(frame: Any) -> np.ndarray:
        i = next(seen)
        if i in wanted:
            kept[i] = frame.to_ndarray(format="rgb24")
        return none

    decode_frames(path, keep, limit=int(idx.max()) + 1)
    if len(kept) < len(wanted):  # the file changed between the decodes
        raise unreadable(path, f"{count} frames on the first decode, {len(kept)} of the clip's on the second")
    return np.stack([kept[i] for i in idx.tolist()]), idx, count


def _find_video(cfg: EvalConfig, video_id: str) -> tuple[Split, int]:
    manifests = sorted(p.stem for p in (Path(cfg.data) / "manifests").glob("*.parquet") if p.stem != "errors")
    for name in manifests:
        split = Split(cfg.data, name)
        hit = np.flatnonzero(split.video_id == video_id)
        if len(hit):
            return split, int(hit[0])
    raise FileNotFoundError(f"{video_id!r} is neither a video file nor a video_id in {cfg.data} "
                            f"(searched manifests: {', '.join(manifests) or 'none'})")


def load_clip(video: str, cfg: EvalConfig, framing: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The middle clip of ``video`` (file path or video_id in ``cfg.data``) -> uint8 (3, T, S, S), source info;
    ``framing``: the encoder's (None: the short side resized to the crop)."""
    path = Path(video)
    if path.is_file():
        frames, idx, count = _decode_clip(path, cfg.frames, cfg.dilation)
        clip = torch.from_numpy(frames)
        info = {"video": str(path.resolve()), "sha256": sha256_file(path), "num_frames": count}
    else:
        if not cfg.data:
            raise FileNotFoundError(f"video file {video} not found (pass --data DIR to look it up as a video_id)")
        split, i = _find_video(cfg, video)
        idx = uniform_clips(int(split.num_frames[i]), cfg.frames, cfg.dilation, 1)[0]
        clip = torch.from_numpy(split.read_frames(i, idx))
        info = {"video_id": video, "split": split.split, "class_name": split.class_name[i],
                "data": str(Path(cfg.data).resolve()), "manifest_checksum": split.checksum_value,
                "num_frames": int(split.num_frames[i])}
    info["frame_indices"] = idx.tolist()
    return spatial_crops(clip, cfg.size, 1, framing)[0], info


def token_cam(backbone: nn.Module, tokens: TokenMap, x: torch.Tensor,
              score: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]) -> tuple[torch.Tensor, dict]:
    """Gradient-weighted tokens of a transformer: ``relu(sum_c A * dS/dA)`` on the (t, h, w) token grid, where A is
    ``tokens.to_map`` of the output of ``tokens.module`` and ``S, info = score(backbone(x))``."""
    with torch.enable_grad():
        y, out = token_output(backbone, tokens, x, grad=True)
        s, info = score(y)
        (grad,) = torch.autograd.grad(s, tensor_of(out))
    rest = out[1:] if isinstance(out, tuple) else None
    a = tokens.to_map(out)
    g = tokens.to_map((grad, *rest) if rest is not None else grad)
    amap = (a * g).sum(1)[0].clamp_min(0).detach()
    return amap, {**info, "tokens": tokens.what, "token_grid": list(amap.shape),
                  "positive_tokens": int((amap > 0).sum())}


def _scores(method: str, head: nn.Module, fc: nn.Linear | None) -> Callable[[torch.Tensor], tuple[torch.Tensor, dict]]:
    """The score a transformer's CAM differentiates (module docstring), from the pooled feature (1, D)."""
    def classifier(feat: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        assert fc is not None
        logits = fc(feat)[0]
        probs = logits.detach().softmax(0)
        pred = int(probs.argmax())
        return logits[pred], {"pred": pred, "prob": probs[pred].item()}

    def projection(feat: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        z = head(feat)[0]
        return z @ F.normalize(z, dim=0).detach(), {}

    def norm(feat: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        return feat[0].norm(), {}

    if method == "classifier" and fc is None:
        raise ValueError("method 'classifier' needs a fine-tuned classifier (run `moquad finetune` first)")
    return {"classifier": classifier, "projection": projection, "norm": norm}[method]


def activation_map(encoder: Encoder, x: torch.Tensor, method: str, fc: nn.Linear | None = None,
                   backbone: nn.Module | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The (t, h, w) activation of normalised clip ``x`` (1, 3, T, H, W): a moquad or torchvision trunk's pre-pool
    map through :func:`activation`, or its transformer's gradient-weighted tokens (:func:`token_cam`), as its
    backbone row says; any other encoder's token grid (:meth:`Encoder.tokens`, as the attentive probe reads it)
    through :func:`activation`. ``backbone``: a fine-tuned copy of the trunk to use instead (with ``fc``)."""
    head = encoder.parts["head"]
    if "backbone" not in encoder.info:  # no trunk of the backbone table: the encoder's own token grid
        return activation(encoder.tokens(x), method, head=head, fc=fc)
    trunk = backbone if backbone is not None else encoder.net
    tokens = BACKBONES[encoder.info["backbone"]].tokens
    if tokens is None:
        return activation(pool_input(trunk, x), method, head=head, fc=fc)
    return token_cam(trunk, tokens, x, _scores(method, head, fc))


def activation(fmap: torch.Tensor, method: str, head: nn.Module | None = None,
               fc: nn.Linear | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """(1, C, t, h, w) feature map -> (t, h, w) activation for ``method``; extra info (prediction)."""
    f = fmap[0]
    c = f.shape[0]
    info: dict[str, Any] = {}
    if method == "classifier":
        if fc is None:
            raise ValueError("method 'classifier' needs a fine-tuned classifier (run `moquad finetune` first)")
        probs = fc(f.mean((1, 2, 3))).softmax(0)
        pred = int(probs.argmax())
        info.update(pred=pred, prob=probs[pred].item())
        return torch.einsum("c,cthw->thw", fc.weight[pred], f), info
    if method == "projection":
        if head is None:
            raise ValueError("method 'projection' needs the checkpoint's projection head")
        local = f.reshape(c, -1).T  # (t*h*w, C)
        z = F.normalize(head(local), dim=1)
        zc = F.normalize(head(f.mean((1, 2, 3))[None]), dim=1)
        return (z @ zc.T).reshape(f.shape[1:]), info
    if method == "norm":
        return f.norm(dim=0), info
    raise ValueError(f"unknown CAM method {method!r}; choose one of {', '.join(METHODS)}")


def strip_figure(clip: torch.Tensor, amap: np.ndarray, title: str, shown: int, frame_numbers: list[int]) -> Any:
    """The CAM strip as a matplotlib Figure: up to ``shown`` frames of the clip (top) and the activation over them
    (bottom), each column labelled with its frame number in the source video, and a colour bar of the scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = clip.shape[1]
    cols = np.unique(np.round(np.linspace(0, t - 1, min(shown, t))).astype(int))
    frames = clip.permute(1, 2, 3, 0).numpy()  # (T, H, W, 3)
    fig, axes = plt.subplots(2, len(cols), figsize=(1.6 * len(cols) + 1.2, 3.8), squeeze=False)
    im = None
    for j, i in enumerate(cols):
        axes[0, j].imshow(frames[i])
        axes[1, j].imshow(frames[i])
        im = axes[1, j].imshow(amap[i], cmap="jet", alpha=0.5, vmin=0, vmax=1)
        axes[0, j].set_title(f"frame {frame_numbers[i]}", fontsize=8)
        for a in axes[:, j]:
            a.set_xticks([])
            a.set_yticks([])
    axes[0, 0].set_ylabel("clip", fontsize=8)
    axes[1, 0].set_ylabel("activation", fontsize=8)
    fig.suptitle(f"{title}\nframe numbers of the source video; activation min-max scaled over the clip", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    bar = fig.add_axes((0.93, 0.1, 0.015, 0.38))
    fig.colorbar(matplotlib.cm.ScalarMappable(im.norm, im.cmap), cax=bar, label="activation")  # opaque colours
    bar.yaxis.label.set_size(8)
    bar.tick_params(labelsize=7)
    return fig


def _strip(clip: torch.Tensor, amap: np.ndarray, path: Path, title: str, shown: int, frame_numbers: list[int]) -> None:
    import matplotlib.pyplot as plt

    fig = strip_figure(clip, amap, title, shown, frame_numbers)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _classifier(cfg: EvalConfig, encoder: Encoder, method: str,
                classifier: str | None) -> tuple[Path | None, Any, list[str] | None]:
    """The fine-tuned classifier CAM's ``classifier`` method reads: ``classifier``, else ``finetune_model.pt`` of
    the evaluation folder when it was fine-tuned from this encoder -> (its path, the network, its classes)."""
    folder = Path(cfg.out) if cfg.out else eval_folder(cfg.checkpoint) if encoder.file is not None else None
    path = Path(classifier) if classifier else folder / "finetune_model.pt" if folder else None
    if method not in ("auto", "classifier") or path is None or not path.is_file():
        return None, None, None
    net, saved = load_classifier(path)
    if classifier or saved.get("source_sha256") == encoder.sha256():
        return path, net, saved["classes"]
    return None, None, None


@torch.no_grad()
def cam(video: str, cfg: EvalConfig, out: str | Path, *, method: str = "auto", classifier: str | None = None,
        shown: int = 8, encoder: Encoder | None = None) -> Path:
    """Draw the activation strip of ``video`` -> PNG path (a JSON with the provenance sits beside it). ``encoder``:
    the one the command resolved (default: the one ``cfg.checkpoint`` names: any encoder name)."""
    if method not in METHODS:
        raise ValueError(f"unknown CAM method {method!r}; choose one of {', '.join(METHODS)}")
    encoder = need_encoder(cfg, encoder, "cam").to("cpu").eval()
    cfg = with_clip(cfg, encoder)
    clip, info = load_clip(video, cfg, encoder.framing)
    cls_path, net, classes = _classifier(cfg, encoder, method, classifier)
    if method == "auto":
        method = "classifier" if net is not None else "projection" if encoder.parts["head"] is not None else "norm"
    amap, extra = activation_map(encoder, encoder.normalize(clip[None], "cpu"), method,
                                 fc=net.fc if net is not None else None, backbone=net.backbone if net is not None else None)
    amap = F.interpolate(amap[None, None], size=clip.shape[1:], mode="trilinear", align_corners=False)[0, 0]
    amap = (amap - amap.min()) / (amap.max() - amap.min()).clamp_min(1e-12)
    if "pred" in extra and classes:
        extra["pred_class"] = classes[extra["pred"]] if extra["pred"] < len(classes) else str(extra["pred"])
    out = Path(out)
    if out.suffix.lower() != ".png":
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", info.get("video_id") or Path(info["video"]).stem)
        out = out / f"cam_{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"{info.get('video_id') or Path(info['video']).name} | {encoder.label} | {method}"
    if "pred_class" in extra:
        title += f" | pred {extra['pred_class']} ({100 * extra['prob']:.0f}%)"
    _strip(clip, amap.numpy(), out, title, shown, info["frame_indices"])
    record = {"task": "cam", "method": method, "source": info, **extra,
              "classifier": str(cls_path) if net is not None else None, "config": to_dict(cfg),
              "checkpoint": {"path": str(Path(cfg.checkpoint).resolve()) if Path(cfg.checkpoint).exists() else
                             cfg.checkpoint, "sha256": encoder.sha256()}, "encoder": encoder.record(),
              "clip": f"{cfg.frames} frames, dilation {cfg.dilation}, middle of the video, "
                      f"{encoder.framing.text(cfg.size)}",
              "environment": environment()}  # the commit, the lock and the machine, as every result
    atomic_write_text(out.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    return out
