"""Dataclass configs for every stage, and the one place their values are checked.

Precedence: dataclass defaults < YAML recipe (``--recipe``) < flags (named options, then
``--set KEY=VALUE``, so ``--set`` wins when both name the same key). The resolved config is
saved next to every output (``config.yaml`` in a run folder, ``dataset.json`` for shards, the
JSON of an evaluation) so each number can be traced to its settings.

Defaults are the paper's main setting (Sec. 4.1: 16 frames at 224 px, LARS lr 3.2 at batch 256,
RAD k=5 with lambda in [0.1, 0.5], the appearance warm-up on the first 20% of epochs, hard
negatives beta=0.01, alpha=1.5; fine-tuning 100 epochs, LARS 0.08). Recipes state only what
differs from them, the CPU demo included (``train/cpu_demo.yaml``, ``eval/cpu_demo.yaml``).

Checking (:mod:`moquad.settings`): every field is checked when a config is built (``__post_init__``, so also by
``dataclasses.replace``), by its annotation plus the rules in its ``metadata``: ``choices``,
``ge`` / ``gt`` / ``le`` (bounds, per element for tuples) and ``ordered`` (a tuple must not
decrease). Allowed coercions: int -> float, list -> tuple, and a dict -> the nested config.
Nothing else: ``lr: "0.1"`` (a quoted YAML string) or ``epochs: 3.0`` are errors. Text from the
command line (``--set lr=0.1``) is parsed by the annotation first (:func:`parse_text`).
A new field needs only its annotation, and metadata where it has a range or a set of choices.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from moquad.data.ops import APPEARANCE_OPS, FLIP_POLICIES, MOTION_OPS
from moquad.models.backbones import BACKBONES, INPUTS  # the backbone and input tables (import no torch)
from moquad.preprocess.datasets import DATASETS  # the dataset-adapter table
from moquad.settings import (  # noqa: F401  (the checking and building functions, used as C.resolve etc.)
    ConfigError,
    check,
    check_value,
    dump,
    parse_sets,
    parse_text,
    resolve,
    rule,
    save,
    to_dict,
    type_hints,
    unwrap_optional,
    update,
)

OPTIMIZERS = ("lars", "sgd", "adamw")
DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("local", "ray")  # moquad.preprocess.engines.ENGINES implements them (a test keeps them equal)


@dataclass
class PreprocessConfig:
    """Stage 1: raw videos -> tar shards + Parquet manifests."""

    dataset: str = rule("folder", choices=tuple(DATASETS))
    root: str = ""
    out: str = ""
    official_split: int = rule(1, ge=1, le=3)  # ucf101 / hmdb51: which official split (flag --split)
    short_side: int = rule(256, ge=8)  # 256 for the paper's 224 crops; 128 is enough for 112
    fps: float | None = rule(None, gt=0)  # None keeps the native frame rate
    jpeg_quality: int = rule(90, ge=1, le=100)
    shard_size: int = rule(1_000_000_000, ge=1)  # source-video bytes per shard (planned before transcoding)
    workers: int = rule(factory=lambda: max(1, os.cpu_count() or 1), ge=1)
    num_parts: int = rule(1, ge=1)
    part: int = rule(0, ge=0)
    limit: int | None = rule(None, ge=1)
    seed: int = rule(0, ge=0)  # shuffle seed, and the seed of a drawn split
    # folder datasets without a split: draw one, e.g. (0.8, 0.2) train,test or (0.7, 0.1, 0.2) train,val,test
    split_ratios: tuple[float, ...] | None = rule(None, gt=0, le=1)
    group_by: str | None = None  # regex on the file name; its first group (or match) never straddles splits
    engine: str = rule("local", choices=ENGINES)  # local process pool, or one Ray task per shard
    ray_address: str | None = None  # Ray cluster to join ("auto": the one `ray start` made); None: a local Ray

    def __post_init__(self) -> None:
        check(self)
        if self.part >= self.num_parts:
            raise ConfigError("part", f"must be below num_parts ({self.num_parts}), got {self.part}")


@dataclass
class LoaderConfig:
    """How clips and views are built from shards (moquad.data)."""

    frames: int = rule(16, ge=1)
    size: int = rule(224, ge=8)  # crop size fed to the network
    dilations: tuple[int, ...] = rule((1, 2, 4), ge=1)  # n and m are drawn from those that fit a video, m != n
    simclr_dilation: int = rule(2, ge=1)  # dilation of both clips of method simclr_classic
    # quadruple ablation switches (Table 4 of the paper)
    ad_pos: bool = True  # RAD on the positive; False -> plain second clip at n
    intra_neg: bool = True  # N: clip at m != n
    ad_intra_neg: bool = True  # N-bar: clip at m, then RAD
    appearance_op: str = rule("rad_inter", choices=tuple(APPEARANCE_OPS))  # moquad.data.ops
    motion_ops: tuple[str, ...] = rule(("speed",), choices=tuple(MOTION_OPS))  # each makes Intra-Negs (ops.py)
    rad_k: int = rule(5, ge=1)
    rad_lambda: tuple[float, float] = rule((0.1, 0.5), ge=0, le=1, ordered=True)
    donors_per_sample: int = rule(2, ge=1)  # RAD-inter donor frames read per sample (one frame each, random videos)
    # spatial augmentation (same for every frame of a clip, independent between clips)
    crop_scale: tuple[float, float] = rule((0.3, 1.0), gt=0, le=1, ordered=True)
    flip: str = rule("independent", choices=tuple(FLIP_POLICIES))  # horizontal flips: per view, per video, never
    color_jitter: float = rule(0.8, ge=0, le=1)  # probability of colour jitter
    color_strength: float = rule(0.5, ge=0)
    grayscale: float = rule(0.2, ge=0, le=1)  # probability of grayscale
    augment_on_device: bool = False  # workers only decode; crop/flip/colour/RAD run on the accelerator
    decode_on_device: bool = False  # workers only read; JPEG decoding (nvJPEG) and augmentation on the GPU
    verify_checksums: bool = True  # the xxh3 (else sha256) of every sample's payload checked on read
    # the bad-sample rule: a run stops only when an epoch's unreadable samples exceed BOTH limits
    max_bad_fraction: float = rule(0.01, ge=0, le=1)  # ... this share of the epoch's samples
    max_bad_count: int = rule(10, ge=0)  # ... and this many (one bad video never stops a small split)
    workers: int = rule(2, ge=0)  # DataLoader worker processes per rank
    seed: int = rule(0, ge=0)

    def __post_init__(self) -> None:
        check(self)


@dataclass
class PretrainConfig:
    """Stage 2: self-supervised pre-training (Algorithm 1 of the paper)."""

    data: str = ""
    out: str = "runs/pretrain"
    split: str = "train"
    method: str = rule("moquad", choices=("moquad", "simclr", "simclr_classic"))  # see moquad.train.loop
    backbone: str = rule("r3d_18", choices=tuple(BACKBONES))
    model_input: str = rule("rgb", choices=tuple(INPUTS))  # diff: the backbone sees frame differences
    proj_dim: int = rule(128, ge=1)
    proj_hidden: int = rule(2048, ge=1)
    epochs: int = rule(200, ge=1)
    batch_size: int = rule(256, ge=1)  # GLOBAL batch (videos), split evenly over ranks
    lr: float = rule(3.2, gt=0)  # at batch 256; scaled linearly with the global batch
    lr_warmup_epochs: float = rule(10.0, ge=0)
    weight_decay: float = rule(1e-6, ge=0)
    optimizer: str = rule("lars", choices=OPTIMIZERS)
    temperature: float = rule(0.1, gt=0)
    warmup_ratio: float = rule(0.2, ge=0, le=1)  # p: share of epochs trained with the appearance task (Eq. 3)
    hard_beta: float = rule(0.01, ge=0, le=1)  # Eq. 4: share of inter negatives treated as hard (0 disables)
    hard_alpha: float = rule(1.5, gt=0)  # Eq. 4: weight of hard inter and intra negatives
    sync_bn: bool | None = None  # None: on when world size > 1 and the backbone has BatchNorm (logged)
    steps_per_epoch: int | None = rule(None, ge=1)  # None: videos in the split // global batch
    ckpt_every: int = rule(500, ge=1)  # steps
    log_every: int = rule(1, ge=1)
    resume: bool = False
    seed: int = rule(0, ge=0)
    device: str = rule("auto", choices=DEVICES)
    loader: LoaderConfig = field(default_factory=LoaderConfig)

    def __post_init__(self) -> None:
        check(self)


INITS = ("checkpoint", "random")  # where fine-tuning starts: the pre-trained weights, or none (the supervised bound)


@dataclass
class LinearConfig:
    """Linear probe (moquad.eval.linear): ``--full`` trains a linear layer on clips (CVRL), ``--fast`` fits
    logistic regression on cached features."""

    epochs: int = rule(100, ge=1)
    lr: float = rule(0.08, gt=0)
    optimizer: str = rule("lars", choices=OPTIMIZERS)
    batch_size: int = rule(32, ge=1)  # training clips per step (--full)
    weight_decay: float = rule(0.0, ge=0)  # --full
    flip: bool = True  # --full: random horizontal flip of training clips; off for left/right-sensitive classes (SSv2)
    l2: float = rule(1e-4, ge=0)  # --fast: L2 penalty of the logistic regression

    def __post_init__(self) -> None:
        check(self)


@dataclass
class FinetuneConfig:
    """Fine-tuning the whole network (moquad.eval.finetune); the paper's protocol: 100 epochs, batch 32,
    LARS 0.08, half-period cosine. A tiny network wants AdamW 1e-3 instead (eval/cpu_demo.yaml)."""

    init: str = rule("checkpoint", choices=INITS)  # random: same backbone and clip, trained on labels only
    backbone: str | None = rule(None, choices=BACKBONES)  # None: the checkpoint's; needed for init=random alone
    epochs: int = rule(100, ge=1)
    lr: float = rule(0.08, gt=0)  # used as given (not scaled with the batch)
    optimizer: str = rule("lars", choices=OPTIMIZERS)
    batch_size: int = rule(32, ge=1)  # GLOBAL batch of training clips, split evenly over ranks
    weight_decay: float = rule(1e-4, ge=0)
    dropout: float = rule(0.5, ge=0, le=1)  # before the classifier
    flip: bool = True  # random horizontal flip of training clips; off for left/right-sensitive classes (SSv2)

    def __post_init__(self) -> None:
        check(self)


@dataclass
class EvalConfig:
    """Stage 3: feature extraction and test views (top level), retrieval and kNN, linear probe, fine-tuning."""

    data: str = ""
    checkpoint: str = ""
    out: str | None = None  # default: <run folder of the checkpoint>/eval
    num_clips: int = rule(10, ge=1)
    frames: int = rule(16, ge=1)
    dilation: int = rule(2, ge=1)
    size: int = rule(224, ge=8)
    crops: int = rule(1, choices=(1, 3))  # 1 centre crop; 3 (the paper's action-recognition test) in eval recipes
    batch_size: int = rule(16, ge=1)  # test views per forward pass
    workers: int = rule(2, ge=0)
    center: bool = False
    ks: tuple[int, ...] = rule((1, 5, 10, 20, 50), ge=1)
    index: str = rule("exact", choices=("exact", "lance"))
    knn_k: int = rule(20, ge=1)  # weighted kNN classification (DINO): neighbours that vote
    knn_t: float = rule(0.07, gt=0)  # ... with weight exp(cosine / knn_t)
    seed: int = rule(0, ge=0)
    device: str = rule("auto", choices=DEVICES)
    linear: LinearConfig = field(default_factory=LinearConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        check(self)
