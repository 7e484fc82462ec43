"""Dataclass configs for every stage.

Precedence: dataclass defaults < YAML recipe (``--recipe``) < CLI flags. The resolved
config is saved next to every output (``config.yaml`` in a run folder, ``dataset.json``
for shards, the JSON of an evaluation) so each number can be traced to its settings.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


@dataclass
class PreprocessConfig:
    """Stage 1: raw videos -> tar shards + Parquet manifests."""

    dataset: str = "folder"  # k400 | ucf101 | hmdb51 | ssv2 | folder
    root: str = ""
    out: str = ""
    split: int = 1  # official split number for ucf101 / hmdb51
    short_side: int = 128
    fps: float | None = None  # None keeps the native frame rate
    jpeg_quality: int = 90
    shard_size: int = 1_000_000_000  # bytes per shard (approximate upper bound)
    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    num_parts: int = 1
    part: int = 0
    limit: int | None = None
    seed: int = 0


@dataclass
class LoaderConfig:
    """How clips and views are built from shards (moquad.data)."""

    mode: str = "moquad"  # simclr | appearance | moquad
    frames: int = 16
    size: int = 112  # crop size fed to the network
    dilations: tuple[int, ...] = (1, 2, 4)  # n and m are drawn from here, m != n
    simclr_dilation: int = 2  # dilation used by both SimCLR clips
    # quadruple ablation switches (Table 4 of the paper)
    ad_pos: bool = True  # RAD on the positive; False -> plain second clip at n
    intra_neg: bool = True  # N: clip at m != n
    ad_intra_neg: bool = True  # N-bar: clip at m, then RAD
    appearance_op: str = "rad_inter"  # rad_inter | rad_intra | be | none
    motion_op: str = "speed"  # speed | reverse | shuffle
    rad_k: int = 5
    rad_lambda: tuple[float, float] = (0.1, 0.5)
    donor_pool: int = 256  # frames kept in the cross-shard donor pool
    # spatial augmentation (same for every frame of a clip, independent between clips)
    crop_scale: tuple[float, float] = (0.3, 1.0)
    flip: bool = True
    color_jitter: float = 0.8  # probability of colour jitter
    color_strength: float = 0.5
    grayscale: float = 0.2  # probability of grayscale
    colour_on_device: bool = False  # ship colour-jitter matrices, apply them on the GPU in normalize()
    augment_on_device: bool = False  # workers only decode; crop/flip/colour/RAD run on the accelerator
    shuffle_buffer: int = 64  # samples held in the in-memory shuffle buffer
    workers: int = 2  # DataLoader worker processes per rank
    seed: int = 0


@dataclass
class PretrainConfig:
    """Stage 2: self-supervised pre-training (Algorithm 1 of the paper)."""

    data: str = ""
    out: str = "runs/pretrain"
    split: str = "train"
    method: str = "moquad"  # moquad | simclr
    backbone: str = "r3d_18"  # tiny | r3d_18 | r2plus1d_18 | s3d | r3d_50
    proj_dim: int = 128
    proj_hidden: int = 2048
    epochs: int = 200
    batch_size: int = 256  # GLOBAL batch (videos), split evenly over ranks
    lr: float = 3.2  # at batch 256; scaled linearly with the global batch
    lr_warmup_epochs: float = 10.0
    weight_decay: float = 1e-6
    optimizer: str = "lars"  # lars | sgd | adamw
    temperature: float = 0.1
    warmup_ratio: float = 0.2  # p: share of epochs trained with the appearance task (Eq. 3)
    hard_beta: float = 0.01  # Eq. 4: share of inter negatives treated as hard (0 disables)
    hard_alpha: float = 1.5  # Eq. 4: weight of hard inter and intra negatives
    sync_bn: bool = False
    steps_per_epoch: int | None = None  # None: videos in the split // global batch
    ckpt_every: int = 500  # steps
    log_every: int = 1
    resume: bool = False
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    loader: LoaderConfig = field(default_factory=LoaderConfig)


@dataclass
class EvalConfig:
    """Stage 3: feature extraction, retrieval, linear probe, fine-tuning."""

    data: str = ""
    checkpoint: str = ""
    out: str | None = None  # default: <run folder of the checkpoint>/eval
    num_clips: int = 10
    frames: int = 16
    dilation: int = 2
    size: int = 112
    crops: int = 1  # 1 centre crop or 3 crops
    batch_size: int = 16
    workers: int = 2
    center: bool = False
    ks: tuple[int, ...] = (1, 5, 10, 20, 50)
    index: str = "exact"  # exact | lance
    knn_k: int = 20  # weighted kNN classification (DINO): neighbours that vote
    knn_t: float = 0.07  # ... with weight exp(cosine / knn_t)
    # linear probe / fine-tuning
    epochs: int = 100
    lr: float = 0.08
    optimizer: str = "lars"
    seed: int = 0
    device: str = "auto"


def _coerce(tp: Any, value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    return value


def update(cfg: T, values: dict[str, Any]) -> T:
    """Return a copy of ``cfg`` with ``values`` applied; nested dataclasses accept dicts.

    Unknown keys are an error (a typo in a recipe must not be silently ignored).
    """
    names = {f.name: f for f in fields(cfg)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            raise ValueError(
                f"unknown setting {key!r} for {type(cfg).__name__}; valid: {', '.join(sorted(names))}"
            )
        current = getattr(cfg, key)
        if is_dataclass(current) and isinstance(value, dict):
            changes[key] = update(current, value)
        else:
            changes[key] = _coerce(names[key].type, value)
    return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read a YAML recipe into a plain dict.

    ``base: other.yaml`` (relative to the recipe) is loaded first and overridden, so each
    paper row is a few lines on top of a shared base. ``description`` and ``paper`` are
    documentation only (the paper's reported numbers for that row).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} not found; pass a YAML file such as train/ucf101_r3d18_moquad.yaml")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"recipe {path} must be a YAML mapping of settings")
    data.pop("description", None)
    data.pop("paper", None)
    base = data.pop("base", None)
    if base:
        data = _deep_merge(load_recipe(path.parent / base), data)
    return data


def resolve(cfg: T, recipe: str | Path | None, overrides: dict[str, Any]) -> T:
    """defaults < recipe < CLI flags; ``None`` in ``overrides`` means 'flag not given'."""
    if recipe:
        cfg = update(cfg, load_recipe(recipe))
    given: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:  # "loader.frames" -> nested
            outer, inner = key.split(".", 1)
            given.setdefault(outer, {})[inner] = value
        else:
            given[key] = value
    return update(cfg, given)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML/JSON-safe dict of a config (tuples become lists)."""

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean(asdict(cfg))


def save(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
