"""Video-level features of a frozen pre-trained backbone (or any encoder of :mod:`moquad.eval.encoders`), cached as
a Lance dataset.

Per video: ``cfg.num_clips`` uniformly spaced clips of ``cfg.frames`` frames at
``cfg.dilation`` (see :mod:`moquad.eval.clips`; unset: the checkpoint's pre-training clip), each as a
centre crop or 3 crops; the
backbone's pooled feature (before the projection head, model in eval mode; another encoder: its family's pooled
feature of clips normalised as its family says) of every view; the plain mean over all views. Features are NOT L2-normalised in the cache
(retrieval / probes normalise as their protocol says).

Cache: ``OUT/features/{split}.lance`` with columns ``video_id, split, label, class_name,
embedding`` (fixed-size list<float32>) in manifest order, and the schema metadata key
``moquad`` = JSON of ``{"protocol", "checkpoint_sha256", "manifest_checksum", ...}``. A later
call with the same protocol, checkpoint bytes (an encoder: :meth:`Encoder.sha256`) and manifest content reuses
it; anything else re-extracts.

Distributed (torchrun env: RANK / WORLD_SIZE): rank r takes rows r, r+W, r+2W, ... (no
padding, no drop_last; :func:`moquad.dist.my_rows`), features are gathered on every rank, which
checks that every video was computed exactly once (:func:`moquad.dist.gather_rows`); rank 0 writes
the dataset. Each video is computed with the same batch composition (its own views) on any number of
ranks, so the feature does not depend on the world size. ``cfg.out`` must be on a filesystem every
rank sees (rank 0 writes).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import torch
from rich.progress import Progress

import moquad
from moquad import dist
from moquad.config import EvalConfig
from moquad.data.augment import normalize
from moquad.data.store import Split
from moquad.errors import MoquadError
from moquad.eval.clips import TestViews
from moquad.eval.common import (
    check_unchanged,
    dist_env,
    encoder_of,
    out_dir,
    resolve_device,
    snapshot,
    with_clip,
)
from moquad.eval.encoders import Encoder
from moquad.objstore import is_url

# Lance warns "not fork-safe" at every fork once imported: a child that uses Lance's runtime can deadlock. Ours never
# do (DataLoader workers decode clips; Lance reads and writes the cache in the parent only), so the warning (twice
# per command: one per worker) is noise here.
warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning, module="lance")

META_KEY = b"moquad"


def protocol(cfg: EvalConfig, split: str, encoder: Encoder) -> dict[str, Any]:
    """The settings that determine a cached feature (the cache key besides the encoder's sha256 and the data)."""
    return {
        "split": split,
        "num_clips": cfg.num_clips,
        "frames": cfg.frames,
        "dilation": cfg.dilation,
        "size": cfg.size,
        "crops": cfg.crops,
        "resize": f"{encoder.framing.text(cfg.size)}, bilinear antialias ({encoder.framing.source})",
        "short_videos": "stretched over the whole video (moquad.data.clip_frames)",
        "feature": f"{encoder.family.pooling}, eval mode, mean over clips x crops",
        "normalize": encoder.norm.source,
    }


def features_path(cfg: EvalConfig, split: str) -> Path:
    """Where ``extract`` caches the features of ``split``."""
    return out_dir(cfg) / "features" / f"{split}.lance"


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """The ``moquad`` metadata of a cached feature dataset, or None when missing/unreadable."""
    try:
        meta = lance.dataset(str(path)).schema.metadata or {}
        return json.loads(meta[META_KEY])
    except (OSError, ValueError, KeyError):
        return None


def read_features(path: str | Path) -> dict[str, Any]:
    """Load a feature dataset -> dict of numpy arrays (embedding, label) and lists, plus metadata."""
    ds = lance.dataset(str(path))
    t = ds.to_table()
    emb = t.column("embedding").combine_chunks()
    dim = emb.type.list_size
    return {
        "video_id": t.column("video_id").to_pylist(),
        "class_name": t.column("class_name").to_pylist(),
        "label": t.column("label").to_numpy().astype(np.int64),
        "embedding": emb.flatten().to_numpy().reshape(-1, dim).astype(np.float32),
        "metadata": json.loads((ds.schema.metadata or {})[META_KEY]),
    }


@torch.inference_mode()
def compute_features(
    backbone: torch.nn.Module, cfg: EvalConfig, split: Split, indices: list[int], show: bool = False
) -> tuple[list[int], np.ndarray]:
    """Features of the manifest rows ``indices`` of ``split`` -> (indices, float32 (len, D)), at ``cfg``'s clip (the
    settings it leaves unset: the encoder's, as every command fills them). ``backbone``: an encoder of
    ``moquad.load_encoder`` (clips framed and normalised as its family says), or a network taking
    moquad-normalised clips (moquad's own framing)."""
    enc = backbone if isinstance(backbone, Encoder) else None
    cfg = with_clip(cfg, enc)  # a library call's unset clip settings (a command's are filled already)
    prep = enc.normalize if enc is not None else normalize
    device = resolve_device(cfg.device)
    backbone = backbone.to(device).eval()
    views = TestViews(split, indices, cfg.frames, cfg.dilation, cfg.num_clips, cfg.size, cfg.crops,
                      enc.framing if enc is not None else None)
    loader = torch.utils.data.DataLoader(views, batch_size=None, shuffle=False, num_workers=cfg.workers)
    done: list[int] = []
    feats: list[np.ndarray] = []
    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task("extracting", total=len(indices))
        for j, views in loader:
            out = [backbone(prep(views[s : s + cfg.batch_size], device)).float()
                   for s in range(0, len(views), cfg.batch_size)]
            feats.append(torch.cat(out).mean(0).cpu().numpy())
            done.append(int(j))
            progress.advance(task)
    dim = feats[0].shape[0] if feats else 0
    return done, (np.stack(feats) if feats else np.zeros((0, dim), np.float32))


def _write(path: Path, split: Split, rows_emb: np.ndarray, meta: dict[str, Any]) -> None:
    dim = rows_emb.shape[1]
    emb = pa.FixedSizeListArray.from_arrays(pa.array(rows_emb.astype(np.float32).ravel()), dim)
    out = pa.table(
        {
            "video_id": pa.array(split.video_id.tolist(), pa.string()),
            "split": pa.array([split.split] * len(split), pa.string()),
            "label": pa.array(split.label, pa.int32()),
            "class_name": pa.array(split.class_name, pa.string()),
            "embedding": emb,
        }
    )
    out = out.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    lance.write_dataset(out, str(tmp), mode="create")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def extract(cfg: EvalConfig, split: str, *, force: bool = False, encoder: Encoder | None = None) -> Path:
    """Extract (or reuse) the features of ``split`` -> path of the Lance dataset (same on every rank). ``encoder``:
    the one the command resolved (default: the one ``cfg.checkpoint`` names); the clip settings left unset
    (``frames``, ``size``, ``dilation``) are its clip (a checkpoint's: its pre-training clip)."""
    encoder = encoder_of(cfg, encoder)
    if encoder is None:
        raise MoquadError("extract needs an encoder; pass --encoder (a checkpoint or another encoder name)")
    cfg = with_clip(cfg, encoder)
    data = Split(cfg.data, split)
    if len(data) == 0:
        raise ValueError(f"split {split!r} of {cfg.data} has no videos; check manifests/errors.parquet")
    path = features_path(cfg, split)
    meta = {
        "protocol": protocol(cfg, split, encoder),
        "checkpoint_sha256": encoder.sha256(),
        "manifest_checksum": data.checksum_value,
        "checkpoint": str(Path(cfg.checkpoint).resolve()) if Path(cfg.checkpoint).exists() else cfg.checkpoint,
        "data": cfg.data if is_url(cfg.data) else str(Path(cfg.data).resolve()),
        "videos": len(data),
        "moquad_version": getattr(moquad, "__version__", None),
    }
    keys = ("protocol", "checkpoint_sha256", "manifest_checksum")
    old = read_metadata(path) if path.exists() and not force else None
    if old is not None and all(old.get(k) == meta[k] for k in keys):
        return path

    rank, _ = dist_env()
    before = snapshot(encoder)
    idx, emb = compute_features(encoder, cfg, data, dist.my_rows(len(data)), show=rank == 0)
    check_unchanged(encoder, before)  # eval mode + inference: weights and BN stats untouched
    ordered = dist.gather_rows(idx, emb, len(data))
    if rank == 0:
        _write(path, data, ordered, meta)
    dist.barrier()
    return path
