"""Export a pre-trained backbone for use outside moquad, with a JSON model card beside it.

``--format torchvision`` (the backbones with ``torchvision`` names in ``moquad.models.BACKBONES``:
r3d_18, mc3_18, r2plus1d_18, s3d, swin3d_t, mvit_v2_s): a ``torch.save``'d state dict under
torchvision's key names. The classifier head is NOT in it (MoQuad pre-trains no classifier;
neither is the contrastive projection head exported), so load it into a headless model::

    model = torchvision.models.video.r3d_18()        # or r2plus1d_18()
    model.fc = torch.nn.Identity()                   # s3d: model.classifier = torch.nn.Identity()
                                                     #      model.avgpool = torch.nn.AdaptiveAvgPool3d(1)
    model.load_state_dict(torch.load(FILE, weights_only=True))   # strict=True
    features = model(clips)                          # (N, 512) r3d/r(2+1)d, (N, 1024) s3d: moquad's features

Into the unmodified model, ``load_state_dict(sd, strict=False)`` reports exactly the head as missing
(``fc.weight, fc.bias``; s3d: ``classifier.1.weight, classifier.1.bias``) and nothing unexpected: the
way to fine-tune with a fresh head. S3D's own ``avgpool`` (2x7x7 window) only fits 224-px input;
moquad pools globally, hence the AdaptiveAvgPool3d above. The transformers drop ``head``
(``model.head = torch.nn.Identity()``; swin3d_t: ``head.weight, head.bias``, mvit_v2_s: ``head.1.*``).
MViT: moquad's trunk always holds ``mvit_v2_s()``'s tables (built for 16 x 224), so the export loads strictly
whatever the pre-training clip; torchvision's forward takes its token grid from ``pos_encoding``, so at a clip
other than 16 x 224 set ``model.pos_encoding.temporal_size = ceil(T / 2)`` and ``spatial_size = (ceil(S / 4),
ceil(S / 4))`` before calling it (the card says so with the numbers): its relative-position tables are then
interpolated exactly as moquad's trunk does.

``--format safetensors`` (every backbone): the same tensors in a ``.safetensors`` file -- torchvision
key names for the torchvision architectures, moquad's own (``moquad.models.build_backbone``)
for ``r3d_50`` and ``tiny``; the card says how to build and load it.

The card (FILE with the suffix ``.json``): the resolved pre-train config from the checkpoint, its
pre-training clip (:func:`moquad.eval.clips.pretrain_clip`), the checkpoint's sha256, the checksum of
the pre-training split's manifest (null, with the reason, when it cannot be read), and the headline
numbers of the evaluations in ``RUN/eval/*.json`` made from this very checkpoint (same sha256), each
with the protocol that made it (clip, test views, splits, data checksums, checkpoint step). A result
of another checkpoint, or one that records no protocol, is never copied: it is listed under
``eval.skipped`` with the reason (and ``moquad export`` prints a line for it). Files are written
atomically (temp + rename).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import moquad
from moquad.config import EXPORT_FORMATS
from moquad.data.augment import MEAN, STD
from moquad.data.store import manifest_checksum, read_manifest
from moquad.digest import sha256_file
from moquad.errors import setting
from moquad.eval.clips import pretrain_clip
from moquad.eval.common import eval_folder
from moquad.io import atomic_write
from moquad.models import BACKBONES, INPUTS
from moquad.models.backbones import DEFAULT_INPUT
from moquad.models.checkpoint import load

FORMATS = EXPORT_FORMATS  # the choices of `moquad export --format` (moquad.config.ExportConfig)
# backbones with torchvision export names (prefix above torchvision's keys, the head the export lacks)
TORCHVISION = {name: b.torchvision for name, b in BACKBONES.items() if b.torchvision is not None}
HEADLINES = ("top1", "top5", "top10", "top20", "top50", "knn_top1", "knn_top5", "mean_class_accuracy")


def backbone_state(ckpt: dict[str, Any], torchvision_names: bool) -> dict[str, torch.Tensor]:
    """The backbone's tensors of a checkpoint, under torchvision's key names or moquad's backbone names."""
    arch = ckpt["config"]["backbone"]
    prefix = "backbone."
    if torchvision_names:
        prefix += TORCHVISION[arch].prefix
    sd = {k[len(prefix):]: v.contiguous() for k, v in ckpt["model"].items() if k.startswith(prefix)}
    if not sd:
        raise ValueError(f"the checkpoint holds no {arch} backbone weights; pass a checkpoint of `moquad pretrain`")
    return sd


def _clip_grid(arch: str, frames: int | None, size: int | None) -> str:
    """The code that tells a definition the token grid of the pre-training clip, for rows with a grid rule
    (:class:`moquad.models.backbones.TokenGrid`: MViT) at a clip other than their native one; else ''."""
    row = BACKBONES[arch]
    if row.grid is None or frames is None or size is None or (frames, size) == row.clip:
        return ""
    t, h, w = row.grid.of(frames, size)
    return f"; {row.grid.tell.format(t=t, h=h, w=w)}  # the token grid of the {frames} x {size} pre-training clip;"


def _load_instructions(arch: str, fmt: str, file: str, model_input: str, clip: Any) -> str:
    read = (f"safetensors.torch.load_file({file!r})" if fmt == "safetensors"
            else f"torch.load({file!r}, weights_only=True)")
    if arch in TORCHVISION:
        return (f"model = torchvision.models.video.{arch}(); {TORCHVISION[arch].strip_head}; "
                f"model.load_state_dict({read}){_clip_grid(arch, clip.frames, clip.size)}  "
                f"# strict; or keep the head and load_state_dict(..., strict=False): missing = the head only")
    build = f"{arch!r}" if model_input == DEFAULT_INPUT else f"{arch!r}, {model_input!r}"  # brings its hook
    return (f"from moquad.models import build_backbone; model, dim = build_backbone({build}); "
            f"model.load_state_dict({read})")


def _data_checksum(cfg: dict[str, Any]) -> dict[str, Any]:
    split = cfg.get("split", "train")
    out: dict[str, Any] = {"dir": cfg.get("data"), "split": split, "manifest_checksum": None}
    if not cfg.get("data"):
        return {**out, "reason": "the checkpoint's config names no data folder"}
    try:
        table = read_manifest(cfg["data"], split)
    except (OSError, ValueError) as e:  # moved, deleted or unreadable since pre-training
        return {**out, "reason": f"manifest not readable here: {str(e).splitlines()[0]}"}
    return {**out, "videos": table.num_rows, "manifest_checksum": manifest_checksum(table)}


def _stale(res: dict[str, Any], sha: str) -> str | None:
    """Why a result may not go into this checkpoint's card; None when it may."""
    made = (res.get("checkpoint") or {}).get("sha256")
    if made != sha:
        return (f"made from another checkpoint (sha256 {str(made)[:12]}, this one {sha[:12]})" if made else
                "records no checkpoint")
    if not isinstance(res.get("clip"), dict) or not isinstance(res.get("views"), dict):
        return "records no protocol (clip, test views): made by an older moquad; re-run the evaluation"
    return None


def result_protocol(res: dict[str, Any]) -> dict[str, Any]:
    """The protocol of an evaluation result, as a card states it beside the numbers."""
    data = res.get("data") or {}
    return {"clip": res["clip"], "views": res["views"], "splits": res.get("splits"),
            "data": {"dir": data.get("dir"), "manifests": data.get("manifests")},
            "checkpoint_step": res["checkpoint"].get("step"), "recipe": (res.get("config") or {}).get("recipe")}


def _eval_results(ckpt_path: Path, sha: str) -> dict[str, Any]:
    """Headline numbers of RUN/eval/*.json made from this checkpoint, each with its protocol; every other result
    file listed under ``skipped`` with the reason."""
    found: dict[str, Any] = {}
    skipped = []
    for path in sorted(eval_folder(ckpt_path).glob("*.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError):
            skipped.append({"file": path.name, "reason": "not readable as JSON"})
            continue
        if not isinstance(res, dict) or "task" not in res:
            continue  # not an evaluation result (a file of the user's)
        reason = _stale(res, sha)
        if reason:
            skipped.append({"file": path.name, "reason": reason})
            continue
        found[path.stem] = {"task": res["task"], **{k: res[k] for k in HEADLINES if k in res},
                            "protocol": result_protocol(res)}
    return {"results": found, "skipped": skipped} if skipped else {"results": found}


def model_card(ckpt: dict[str, Any], ckpt_path: Path, fmt: str, out: Path, sha: str) -> dict[str, Any]:
    """The JSON written beside an export (see the module docstring)."""
    cfg = ckpt["config"]
    arch, model_input = cfg["backbone"], cfg.get("model_input", DEFAULT_INPUT)
    clip = pretrain_clip(cfg)
    return {
        "moquad_version": moquad.__version__,
        "file": out.name, "format": fmt, "file_sha256": sha256_file(out),
        "architecture": arch,
        "feature_dim": BACKBONES[arch].dim,
        "keys": "torchvision" if arch in TORCHVISION else "moquad.models.build_backbone",
        "load": _load_instructions(arch, fmt, out.name, model_input, clip),
        "not_exported": (list(TORCHVISION[arch].head) if arch in TORCHVISION else [])
        + ["MoQuad projection head (head.*: pre-training only)"],
        "input": {"layout": "(N, 3, T, H, W) float32", "normalize": "(x / 255 - mean) / std, RGB",
                  "mean": list(MEAN), "std": list(STD), "pretrain_frames": clip.frames,
                  "pretrain_size": clip.size, "pretrain_dilations": list(clip.dilations),
                  "transform": INPUTS[model_input][1] + ("" if INPUTS[model_input][0] is None else
                                                         "; apply it before the exported network")},
        "checkpoint": {"path": str(ckpt_path.resolve()), "sha256": sha, "step": ckpt.get("step"),
                       "epoch": ckpt.get("epoch"), "git": ckpt.get("git"),
                       "moquad_version": ckpt.get("moquad_version")},
        "pretrain_config": cfg,
        "data": _data_checksum(cfg),
        "eval": _eval_results(ckpt_path, sha),
    }


def export(checkpoint: str | Path, fmt: str, out: str | Path) -> tuple[Path, Path]:
    """Write the backbone of ``checkpoint`` to ``out`` in ``fmt`` and the model card beside it."""
    ckpt_path, out = Path(checkpoint), Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if out.suffix == ".json":
        raise ValueError(f"the output {out} would clash with its model card; use .pt / .pth / .safetensors")
    ckpt = load(ckpt_path)
    cfg = ckpt.get("config") if isinstance(ckpt, dict) else None
    if not isinstance(cfg, dict) or "model" not in ckpt or "backbone" not in cfg:
        raise ValueError(f"{ckpt_path} is not a moquad pretrain checkpoint (no model or backbone in it); "
                         "pass RUN/checkpoints/last.pt")
    arch = cfg["backbone"]
    if fmt == "torchvision" and arch not in TORCHVISION:
        raise ValueError(f"{arch} is not a torchvision architecture; export it with {setting('format', 'safetensors')}")
    sd = backbone_state(ckpt, torchvision_names=arch in TORCHVISION)
    sha = sha256_file(ckpt_path)
    hint = "re-run the export"
    if fmt == "safetensors":
        from safetensors.torch import save

        meta = {"architecture": arch, "checkpoint_sha256": sha, "moquad_version": moquad.__version__}
        atomic_write(out, lambda f: f.write(save({k: v.contiguous() for k, v in sd.items()}, metadata=meta)), hint)
    else:
        atomic_write(out, lambda f: torch.save(sd, f), hint)
    card_path = out.with_suffix(".json")
    card = model_card(ckpt, ckpt_path, fmt, out, sha)
    atomic_write(card_path, lambda f: f.write((json.dumps(card, indent=2, default=str) + "\n").encode()), hint)
    return out, card_path
