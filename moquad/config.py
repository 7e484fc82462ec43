"""Dataclass configs for every stage, and the rules that check each field when a config is built.

Precedence (:func:`moquad.settings.resolve`): dataclass defaults < YAML recipe (``--recipe``) < flags (named
options, then ``--set KEY=VALUE``, so ``--set`` wins when both name the same key). The resolved config is
saved next to every output (``config.yaml`` in a run folder, ``dataset.json`` for shards, the
JSON of an evaluation) so each number can be traced to its settings.

Defaults are the paper's main setting (Sec. 4.1: 16 frames at 224 px, LARS lr 3.2 at batch 256 for the CNNs:
the backbone's optimizer and its setting, from their tables; RAD k=5 with lambda in [0.1, 0.5], the appearance
warm-up on the first 20% of epochs, hard negatives beta=0.01, alpha=1.5; fine-tuning 100 epochs, LARS 0.08).
Recipes state only what differs from them, the CPU demo included (``train/cpu_demo.yaml``, ``eval/cpu_demo.yaml``).

Checking: every field is checked when a config is built (``__post_init__``, so also by
``dataclasses.replace``), by its annotation plus the rules in its ``metadata``: ``choices``,
``ge`` / ``gt`` / ``le`` (bounds, per element for tuples) and ``ordered`` (a tuple must not
decrease). Allowed coercions: int -> float, list -> tuple, and a dict -> the nested config.
Nothing else: ``lr: "0.1"`` (a quoted YAML string) or ``epochs: 3.0`` are errors. Text from the
command line (``--set lr=0.1``) is parsed by the annotation first (:func:`parse_text`).
A new field needs only its annotation, and metadata where it has a range or a set of choices; a field with
a command-line flag carries the flag's help too (``rule(16, ge=1, help="Frames per clip.")``).
A field that names a row of an extension-point table (a backbone, an appearance op, a dataset ...) is
checked against that table by :func:`moquad.settings.resolve`: the tables live in the modules that own
them, which sit above this one (they import these configs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from moquad.errors import MoquadError

T = TypeVar("T")


class ConfigError(MoquadError, ValueError):
    """A setting with a wrong type or value; ``key`` is its dotted name (``loader.size``)."""

    def __init__(self, key: str, problem: str, message: str | None = None):
        super().__init__(message or f"{key} {problem}")
        self.key, self.problem = key, problem


def rule(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, help: str | None = None,
         **rules: Any) -> Any:
    """A dataclass field with checking rules (``rule(200, ge=1)``, ``rule("moquad", choices=(...))``) and the help
    of its command-line flag (``help="Training epochs."``: the one place the text is written; the flag adds the
    choices and this default, see :func:`moquad.cli_common.flag_help`)."""
    return field(default=default, default_factory=factory, metadata=rules if help is None else {**rules, "help": help})


# ----------------------------------------------------------------------------- checking


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """Field name -> annotation of a config class, resolved (the module uses postponed annotations)."""
    return typing.get_type_hints(cls)


_TYPE_NAMES = {int: ("an int", "ints"), float: ("a number", "numbers"), str: ("a string", "strings"),
               bool: ("true or false", "booleans")}


def _type_name(tp: Any, plural: bool = False) -> str:
    return _TYPE_NAMES.get(tp, (str(tp), str(tp)))[plural]


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _scalar(key: str, tp: Any, value: Any, rules: dict[str, Any]) -> Any:
    if tp is float and type(value) is int:
        value = float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(key, f"must be {_type_name(tp)}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
    for name, ok, word in (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<=")):
        if name in rules and not ok(value, rules[name]):
            raise ConfigError(key, f"must be {word} {rules[name]}, got {value!r}")
    return value


def check_value(key: str, tp: Any, value: Any, rules: dict[str, Any] | None = None) -> Any:
    """``value`` as annotation ``tp`` wants it (int -> float, list -> tuple), else :class:`ConfigError`."""
    rules = rules or {}
    tp, optional = unwrap_optional(tp)
    if value is None and optional:
        return None
    if typing.get_origin(tp) is not tuple:
        return _scalar(key, tp, value, rules)
    args = typing.get_args(tp)
    variadic = len(args) == 2 and args[1] is Ellipsis
    what = f"a list of {'' if variadic else f'{len(args)} '}{_type_name(args[0], plural=True)}"
    if not isinstance(value, (list, tuple)) or (variadic and not value) or (not variadic and len(value) != len(args)):
        raise ConfigError(key, f"must be {what}, got {value!r}")
    elems = args[:1] * len(value) if variadic else args
    out = tuple(_scalar(key, t, v, rules) for t, v in zip(elems, value))
    if rules.get("ordered") and list(out) != sorted(out):
        raise ConfigError(key, f"must not decrease (low, high), got {list(out)}")
    return out


def check(cfg: Any) -> None:
    """Check (and coerce in place) every field of a config; nested configs were checked when built."""
    hints = type_hints(type(cfg))
    for f in fields(cfg):
        tp, value = hints[f.name], getattr(cfg, f.name)
        if is_dataclass(tp):
            if isinstance(value, dict):
                value = update(tp(), value, prefix=f"{f.name}.")
            elif not isinstance(value, tp):
                raise ConfigError(f.name, f"must be a mapping of {tp.__name__} settings, got {value!r}")
            setattr(cfg, f.name, value)
        else:
            setattr(cfg, f.name, check_value(f.name, tp, value, dict(f.metadata)))


def parse_text(key: str, tp: Any, text: str) -> Any:
    """A command-line string as annotation ``tp`` reads it: ``1,4`` (or ``[1, 4]``) for tuples,
    ``true``/``false`` for bools, ``none`` for optional settings."""
    tp, optional = unwrap_optional(tp)
    text = text.strip()
    if optional and text.lower() in ("none", "null", ""):
        return None
    if typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        return tuple(parse_text(key, elem, part) for part in text.strip("[]()").split(",") if part.strip())
    if tp is bool:
        words = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
        if text.lower() not in words:
            raise ConfigError(key, f"must be true or false, got {text!r}")
        return words[text.lower()]
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ConfigError(key, f"must be {_type_name(tp)}, got {text!r}") from None
    return text


# ----------------------------------------------------------------------------- building


def _valid_keys(cfg: Any, prefix: str = "") -> list[str]:
    return sorted(f"{prefix}{f.name}" + (".*" if is_dataclass(getattr(cfg, f.name)) else "") for f in fields(cfg))


def _unknown(key: str, valid: list[str]) -> ConfigError:
    return ConfigError(key, "is unknown", f"unknown setting {key!r}; valid: {', '.join(valid)}")


def update(cfg: T, values: dict[str, Any], prefix: str = "") -> T:
    """Return a checked copy of ``cfg`` with ``values`` applied; nested configs accept dicts.

    Unknown keys are an error (a typo in a recipe must not be silently ignored).
    """
    names = {f.name for f in fields(cfg)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            raise _unknown(f"{prefix}{key}", _valid_keys(cfg, prefix))
        current = getattr(cfg, key)
        if is_dataclass(current) and isinstance(value, dict):
            changes[key] = update(current, value, prefix=f"{prefix}{key}.")
        else:
            changes[key] = value
    try:
        return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]
    except ConfigError as e:
        if prefix and not e.key.startswith(prefix):
            raise ConfigError(prefix + e.key, e.problem) from None
        raise


def parse_sets(cfg: Any, assignments: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["epochs=5", "loader.dilations=1,4"]`` -> nested dict of values parsed by each field's annotation."""
    out: dict[str, Any] = {}
    for item in assignments:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item!r}", "must look like KEY=VALUE, e.g. --set loader.dilations=1,4")
        target, node, parts = cfg, out, key.strip().split(".")
        for i, part in enumerate(parts):
            prefix = ".".join(parts[:i]) + "." if i else ""
            if not is_dataclass(target):
                raise ConfigError(key, "is unknown", f"unknown setting {key!r}: {prefix[:-1]} has no sub-settings")
            if part not in {f.name for f in fields(target)}:
                raise _unknown(key, _valid_keys(target, prefix))
            if i < len(parts) - 1:
                target, node = getattr(target, part), node.setdefault(part, {})
            else:
                node[part] = parse_text(key, type_hints(type(target))[part], text)
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML/JSON-safe dict of a config (tuples become lists)."""

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean(asdict(cfg))


def dump(cfg: Any) -> str:
    """The config as YAML text (what ``--print-config`` shows and ``config.yaml`` holds)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from moquad.io import atomic_write_text

    atomic_write_text(path, dump(cfg))


# ----------------------------------------------------------------------------- the configs

DEVICES = ("auto", "cpu", "cuda")
# how a momentum encoder normalises its keys: the names of moquad.train.momentum.KEY_NORMS
KEY_BN = ("batch", "groups", "running", "split")


@dataclass
class PreprocessConfig:
    """Stage 1: raw videos -> tar shards + Parquet manifests."""

    # a row of preprocess.datasets.DATASETS
    dataset: str = rule("folder", help="Dataset adapter (the layout each reads: `moquad preprocess --help`).")
    root: str = rule("", help="Dataset root (videos and annotation files).")
    out: str = rule("", help="Output folder (or s3://, gs:// URL) for shards and manifests.")
    # ucf101 / hmdb51: which numbered official train/test split (flag --official-split; not a manifest split)
    official_split: int = rule(1, ge=1, le=3, help="Which official train/test split of the dataset.")
    short_side: int = rule(256, ge=8, help="Resize so the short side is this many pixels (128 is enough for 112 "
                           "crops).")  # 256 for the paper's 224 crops
    fps: float | None = rule(None, gt=0, help="Resample to this frame rate (none: native).")
    jpeg_quality: int = rule(90, ge=1, le=100, help="JPEG quality, 1-100.")
    shard_size: int = rule(1_000_000_000, ge=1, help="Source-video bytes per shard: shards are planned before "
                           "transcoding.")
    workers: int = rule(factory=lambda: max(1, os.cpu_count() or 1), ge=1, help="Parallel transcoding processes "
                        "(default: this machine's CPU count).")
    num_parts: int = rule(1, ge=1, help="Split the video list into N parts (one per node).")
    part: int = rule(0, ge=0, help="Which part this process writes (0..N-1).")
    limit: int | None = rule(None, ge=1, help="Only the first N videos after shuffling (trial runs).")
    seed: int = rule(0, ge=0, help="Shuffle seed (also the seed of --split-ratios).")  # and of a drawn split
    # folder datasets without a split: draw one, e.g. (0.8, 0.2) train,test or (0.7, 0.1, 0.2) train,val,test
    split_ratios: tuple[float, ...] | None = rule(None, gt=0, le=1, help="folder: draw a split per class, e.g. "
                                                  "0.8,0.2 (train,test) or 0.7,0.1,0.2.")
    # its first group (or match) never straddles splits
    group_by: str | None = rule(None, help=r"Regex on file names kept in one split, e.g. '_g(\d+)_'.")
    engine: str = rule("local", help="Who writes the shards: this machine's process pool or Ray (one task per "
                       "shard).")  # moquad.preprocess.engines.ENGINES
    ray_address: str | None = rule(None, help="Ray cluster for --engine ray ('auto' after `ray start`).")  # None: local

    def __post_init__(self) -> None:
        check(self)
        if self.part >= self.num_parts:
            raise ConfigError("part", f"must be below num_parts ({self.num_parts}), got {self.part}")


@dataclass
class LoaderConfig:
    """How clips and views are built from shards: the settings of ``moquad.make_loader`` (``PretrainConfig.loader``
    in a pre-training run)."""

    frames: int = rule(16, ge=1, help="Frames per clip.")
    size: int = rule(224, ge=8, help="Crop size in pixels.")  # fed to the network
    dilations: tuple[int, ...] = rule((1, 2, 4), ge=1, help="Frame steps n and m are drawn from (those that fit "
                                      "a video; m != n).")
    simclr_dilation: int = rule(2, ge=1, help="Frame step of both clips of method simclr_classic.")
    # quadruple ablation switches (Table 4 of the paper)
    ad_pos: bool = rule(True, help="RAD on the positive.")  # False -> plain second clip at n
    intra_neg: bool = rule(True, help="Use the Intra-Neg.")  # N: clip at m != n
    ad_intra_neg: bool = rule(True, help="Use the AD-Intra-Neg.")  # N-bar: clip at m, then RAD
    appearance_op: str = rule("rad_inter", help="Appearance disturbance.")  # moquad.data.ops.APPEARANCE_OPS
    # rows of moquad.data.ops.MOTION_OPS; each makes Intra-Negs
    motion_ops: tuple[str, ...] = rule(("speed",), help="Motion ops making Intra-Negs, comma-separated (several: one "
                                       "Intra-Neg pair each).")
    rad_k: int = rule(5, ge=1, help="RAD: the mosaic is k x k windows.")
    rad_lambda: tuple[float, float] = rule((0.1, 0.5), ge=0, le=1, ordered=True, help="RAD: the mosaic's weight "
                                           "lambda is drawn from this range (low, high).")
    donors_per_sample: int = rule(2, ge=1, help="RAD-inter: donor frames read per sample (one frame each, of "
                                  "random other videos).")
    # spatial augmentation (same for every frame of a clip, independent between clips)
    crop_scale: tuple[float, float] = rule((0.3, 1.0), gt=0, le=1, ordered=True, help="Random crops cover this "
                                           "share of the frame's area (low, high).")
    flip: str = rule("independent", help="Horizontal flips: per view, per video (shared) or never "
                     "(none).")  # moquad.data.ops.FLIP_POLICIES
    color_jitter: float = rule(0.8, ge=0, le=1, help="Probability of colour jitter.")
    color_strength: float = rule(0.5, ge=0, help="Strength of the colour jitter (SimCLR's s).")
    grayscale: float = rule(0.2, ge=0, le=1, help="Probability of grayscale.")
    augment_on_device: bool = rule(False, help="Workers only decode; crop, flip, colour and RAD run on the GPU.")
    decode_on_device: bool = rule(False, help="Workers only read; JPEG decoding (nvJPEG) and augmentation run on "
                                  "the GPU.")
    scaled_decode: bool = rule(True, help="Decode a frame at 1/2, 1/4 or 1/8 when its crops still cover the crop "
                               "size (libjpeg-turbo).")
    verify_checksums: bool = rule(True, help="Check every sample's payload against its manifest checksum on read.")
    # the bad-sample rule: a run stops only when an epoch's unreadable samples exceed BOTH limits
    max_bad_fraction: float = rule(0.01, ge=0, le=1, help="A run stops when an epoch's unreadable samples exceed "
                                   "this share of its samples AND max_bad_count.")
    max_bad_count: int = rule(10, ge=0, help="... and this many (one bad video never stops a small split).")
    workers: int = rule(2, ge=0, help="Data loader processes per rank.")  # DataLoader workers
    seed: int = rule(0, ge=0, help="Seed of the clips, views and augmentations drawn (with the epoch).")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class PretrainConfig:
    """Stage 2: self-supervised pre-training (Algorithm 1 of the paper)."""

    data: str = rule("", help="Shard folder written by `moquad preprocess`.")
    out: str = rule("runs/pretrain", help="Run folder (checkpoints, logs, config).")
    split: str = rule("train", help="Manifest split to learn from.")
    method: str = rule("moquad", help="Pre-training method.")  # a row of moquad.train.methods.METHODS
    backbone: str = rule("r3d_18", help="Video encoder.")
    # moquad.models.backbones.INPUTS; THE default of a model's input, read by every place that builds one
    model_input: str = rule("rgb", help="What the backbone sees (diff: frame differences).")
    proj_dim: int = rule(128, ge=1, help="Output size of the projection head.")
    proj_hidden: int = rule(2048, ge=1, help="Hidden size of the projection head.")
    epochs: int = rule(200, ge=1, help="Training epochs.")
    batch_size: int = rule(256, ge=1, help="GLOBAL batch size in videos (split over ranks).")
    # the optimizer and its three settings: None = the backbone row's optimizer, and that optimizer's pre-training
    # setting (lars: the paper's); settled in ONE place, moquad.train.optimizers.pretrain_optimizer
    lr: float | None = rule(None, gt=0, help="Learning rate at batch 256, scaled linearly (default: the "
                            "optimizer's).")
    lr_warmup_epochs: float | None = rule(None, ge=0, help="Linear learning-rate warm-up epochs (default: the "
                                          "optimizer's).")
    weight_decay: float | None = rule(None, ge=0, help="Weight decay, none on norms and biases (default: the "
                                      "optimizer's).")
    optimizer: str | None = rule(None, help="Optimizer (default: the backbone's: lars for the CNNs, adamw_vit for "
                                 "the transformers).")  # a row of moquad.train.optimizers.OPTIMIZERS
    temperature: float = rule(0.1, gt=0, help="Softmax temperature tau.")
    # p: share of epochs trained with the appearance task (Eq. 3)
    warmup_ratio: float = rule(0.2, ge=0, le=1, help="Share of epochs on the appearance task (Alg. 1).")
    hard_beta: float = rule(0.01, ge=0, le=1, help="Eq. 4: share of inter negatives mined as hard (0: off).")
    hard_alpha: float = rule(1.5, gt=0, help="Eq. 4: weight of hard and intra negatives.")
    # the momentum encoder of methods that have one (moquad.train.momentum): EMA from m0 (cosine to 1), queue of keys
    momentum: float = rule(0.99, ge=0, le=1, help="Momentum encoder: EMA coefficient m0 at the start (cosine to 1).")
    queue_size: int = rule(4096, ge=0, help="Momentum methods: negative keys kept in the queue.")
    # the momentum slot's own choices (moquad.train.methods.Momentum); none: the method's row decides
    symmetric: bool | None = rule(None, help="Momentum methods: the anchor and the positive each query the other's "
                                  "key (none: the method's choice).")
    predictor: bool | None = rule(None, help="Momentum methods: an MLP predictor on the online projections (none: "
                                  "the method's choice).")
    key_bn: str | None = rule(None, choices=KEY_BN, help="Momentum methods: the BatchNorm statistics of the keys: "
                              "batch (the whole batch), groups (each key_bn_group videos apart; queries over the batch), "
                              "split (queries and keys in groups, each key in another group than its query), running "
                              "(the online network's running statistics); none: the method's choice.")
    key_bn_group: int = rule(4, ge=2, help="Momentum methods, key_bn groups: videos per BatchNorm group of keys.")
    # None: on when world size > 1 and the backbone has BatchNorm (logged)
    sync_bn: bool | None = rule(None, help="SyncBatchNorm across ranks (none: on with more than one rank and a "
                                "BatchNorm backbone; GPU processes only; the choice is printed).")
    steps_per_epoch: int | None = rule(None, ge=1, help="Override batches per epoch (none: videos // global batch).")
    ckpt_every: int = rule(500, ge=1, help="Checkpoint every N steps.")
    log_every: int = rule(1, ge=1, help="Log every N steps.")
    resume: bool = rule(False, help="Continue the run in OUT from OUT/checkpoints/last.pt (a setting changed since "
                        "is refused, but for devices, workers, logging and checkpoint intervals).")
    seed: int = rule(0, ge=0, help="Seed for model init and data order.")
    device: str = rule("auto", choices=DEVICES, help="Where to train.")
    loader: LoaderConfig = field(default_factory=LoaderConfig)

    def __post_init__(self) -> None:
        check(self)


INITS = ("checkpoint", "random")  # where fine-tuning starts: the pre-trained weights, or none (the supervised bound)


@dataclass
class LinearConfig:
    """Linear probe (moquad.eval.linear): ``--full`` trains a linear layer on clips (CVRL), ``--fast`` fits
    logistic regression on cached features."""

    epochs: int = rule(100, ge=1, help="Training epochs (--full).")
    lr: float = rule(0.08, gt=0, help="Learning rate (--full).")
    optimizer: str = rule("lars", help="Optimizer (--full).")  # a row of moquad.train.optimizers.OPTIMIZERS
    batch_size: int = rule(32, ge=1, help="Training clips per step (--full).")
    weight_decay: float = rule(0.0, ge=0, help="Weight decay (--full).")
    flip: bool = rule(True, help="Random horizontal flip of training clips (--full); off for left/right-sensitive "
                      "classes (SSv2).")
    l2: float = rule(1e-4, ge=0, help="L2 penalty of the logistic regression (--fast).")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class AttentiveConfig:
    """Attentive probe (moquad.eval.attentive), V-JEPA 2's frozen evaluation: learnable query, ``depth - 1``
    self-attention blocks over the frozen tokens then one cross-attention block, a linear classifier; AdamW with a
    half-period cosine to 0, on tokens extracted once. Defaults: V-JEPA 2's ViT-L probes (configs/eval/vitl)."""

    depth: int = rule(4, ge=1, help="Pooler blocks: depth - 1 self-attention blocks, then the cross-attention block "
                      "(V-JEPA 2: 4).")
    heads: int = rule(16, ge=1, help="Attention heads of the pooler (V-JEPA 2: 16); must divide the token width.")
    mlp_ratio: float = rule(4.0, gt=0, help="Hidden width of the pooler's MLPs over the token width (V-JEPA 2: 4).")
    epochs: int = rule(20, ge=1, help="Training epochs over the extracted tokens (V-JEPA 2: 20).")
    lr: float = rule(1e-3, gt=0, help="Peak learning rate (V-JEPA 2 trains a grid, 1e-4 to 5e-3).")
    weight_decay: float = rule(0.01, ge=0, help="AdamW weight decay (V-JEPA 2's grid: 0.01 to 0.8).")
    batch_size: int = rule(256, ge=1, help="Training samples (a video's crop) per step (V-JEPA 2: 256).")
    optimizer: str = rule("adamw", help="Optimizer (a row of the optimizer table; V-JEPA 2: adamw).")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class FinetuneConfig:
    """Fine-tuning the whole network (moquad.eval.finetune); the paper's protocol: 100 epochs, batch 32,
    LARS 0.08 (a CNN backbone's default optimizer), half-period cosine. A tiny network wants AdamW 1e-3 instead
    (eval/cpu_demo.yaml); a transformer backbone's default is adamw_vit (VideoMAE's fine-tuning setting)."""

    init: str = rule("checkpoint", choices=INITS, help="checkpoint (pre-trained weights) or random (the supervised "
                     "bound: same backbone, labels only).")
    # a BACKBONES row; None: the checkpoint's; needed for init=random alone
    backbone: str | None = rule(None, help="Backbone; the checkpoint's by default; with --init random it makes "
                                "--checkpoint optional.")
    epochs: int = rule(100, ge=1, help="Training epochs (the paper's 100; eval/cpu_demo.yaml: 60).")
    # the optimizer and its two settings: None = the backbone row's optimizer (an encoder of another family: its
    # row's) and that optimizer's fine-tuning setting; settled in ONE place, moquad.train.optimizers.finetune_optimizer
    lr: float | None = rule(None, gt=0, help="Learning rate, as given, not scaled with the batch (default: the "
                            "optimizer's fine-tuning setting: lars 0.08, the paper's).")
    optimizer: str | None = rule(None, help="Optimizer (default: the backbone's: lars for the CNNs, adamw_vit for "
                                 "the transformers).")  # a row of moquad.train.optimizers.OPTIMIZERS
    batch_size: int = rule(32, ge=1, help="Global training batch.")  # split evenly over ranks
    weight_decay: float | None = rule(None, ge=0, help="Weight decay (default: the optimizer's fine-tuning "
                                      "setting: lars 1e-4).")
    dropout: float = rule(0.5, ge=0, le=1, help="Dropout before the classifier.")
    flip: bool = rule(True, help="Random horizontal flip of training clips; off for left/right-sensitive classes "
                      "(SSv2).")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class EvalConfig:
    """Stage 3: feature extraction and test views (top level), retrieval and kNN, linear probe, fine-tuning."""

    data: str = rule("", help="Shard folder of the evaluation dataset.")
    checkpoint: str = rule("", help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt).")
    out: str | None = rule(None, help="Folder for features and results (default: RUN/eval beside the checkpoint).")
    # the manifest splits a protocol trains on and tests on (retrieval: the gallery and the queries); each
    # benchmark's recipe names its own: UCF101 / HMDB51 test on test, SSv2 and K400 on val (SSv2's test has no labels)
    train_split: str = rule("train", help="Manifest split to train on (retrieval: the gallery).")
    test_split: str = rule("test", help="Manifest split to test on (retrieval: the queries); the SSv2 and K400 "
                           "recipes set val.")
    num_clips: int = rule(10, ge=1, help="Uniformly spaced test clips per video.")
    # the clip: None = the checkpoint's pre-training clip (moquad.eval.common.with_clip); a value that differs
    # from it is evaluated as given, with a warning naming both
    frames: int | None = rule(None, ge=1, help="Frames per clip (default: the clip the encoder was "
                              "pre-trained at, or its family's native clip; without either 16).")
    dilation: int | None = rule(None, ge=1, help="Frame step inside a clip (default: the encoder family's own, "
                                "else 2 kept inside the range of a checkpoint's pre-training dilations).")
    size: int | None = rule(None, ge=8, help="Crop size (default: the clip the encoder was pre-trained at, or "
                            "its family's native clip; without either 224).")
    # 3 crops (the paper's action-recognition test) in the eval recipes
    crops: int = rule(1, choices=(1, 3), help="Test crops per clip: 1 (centre) or 3 (the paper's action-recognition "
                      "test).")
    batch_size: int = rule(16, ge=1, help="Test views per forward pass.")
    workers: int = rule(2, ge=0, help="Decoding worker processes.")
    center: bool = rule(False, help="Subtract each split's mean, then L2-normalise.")
    ks: tuple[int, ...] = rule((1, 5, 10, 20, 50), ge=1, help="Retrieval: the k of each hit@k.")
    index: str = rule("exact", choices=("exact", "lance"), help="exact search, or a lance vector index (its recall is "
                      "reported).")
    knn_k: int = rule(20, ge=1, help="Weighted kNN (DINO): neighbours that vote.")
    knn_t: float = rule(0.07, gt=0, help="Weighted kNN (DINO): a vote weighs exp(cosine / T).")
    seed: int = rule(0, ge=0, help="Seed of the training protocols (linear --full, fine-tuning).")
    device: str = rule("auto", choices=DEVICES, help="Where to run.")
    linear: LinearConfig = field(default_factory=LinearConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    attentive: AttentiveConfig = field(default_factory=AttentiveConfig)
    recipe: str | None = rule(None, help="The recipe this config came from (set by the command; results record "
                              "it).")

    def __post_init__(self) -> None:
        check(self)
        if self.test_split == self.train_split:
            raise ConfigError("test_split", f"must differ from train_split (both {self.test_split!r}): a protocol "
                              "tests on videos it did not train on")


EXPORT_FORMATS = ("torchvision", "safetensors")  # moquad.export: torchvision key names (no head), or safetensors


@dataclass
class ExportConfig:
    """``moquad export``: a pre-trained backbone for use outside moquad, with a JSON model card (moquad.export)."""

    checkpoint: str = rule("", help="Checkpoint of `moquad pretrain` (RUN/checkpoints/last.pt).")
    format: str = rule("torchvision", choices=EXPORT_FORMATS, help="torchvision (the backbones "
                       "torchvision defines: its key names, no head) or safetensors (any backbone).")
    out: str = rule("", help="File to write; the JSON model card goes beside it (.json).")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class MotionConfig:
    """``moquad motion``: the motion report of frozen encoders (moquad.eval.motion.motion_report)."""

    data: str = rule("", help="Shard folder of `moquad preprocess`.")
    out: str = rule("motion", help="Folder for motion.json, motion.txt and motion.png.")
    split: str | None = rule(None, help="Manifest split to measure (default: test, else val / validation, else train).")
    frames: int | None = rule(None, ge=1, help="Frames per clip (default: the first moquad encoder's pre-training "
                              "clip, else the first encoder's native clip, its backbone's).")
    size: int | None = rule(None, ge=8, help="Crop size (default: as --frames, from the same encoder's clip).")
    dilation: int = rule(1, ge=1, help="Frame step of the 1x clip (2x and 4x double and quadruple it).")
    max_videos: int | None = rule(None, ge=1, help="Measure a seeded random subset of at most this many videos.")
    pair: tuple[str, ...] | None = rule(None, help="A class pair differing only by direction, 'A|B' (repeatable); built-in "
                                 "SSv2 and synthetic direction pairs are added when the split has them.")
    knn_k: int = rule(10, ge=1, help="Neighbours voting in the direction-pair kNN.")
    seed: int = rule(0, ge=0, help="Seed of the train / test halves of the classifiers.")
    batch_size: int = rule(16, ge=1, help="Views per forward pass.")
    workers: int = rule(0, ge=0, help="Decoding worker processes.")
    device: str = rule("cpu", choices=("cpu", "cuda"), help="Where to run.")
    threads: int | None = rule(None, ge=1, help="CPU threads of torch (default: torch's; 1 on a busy machine).")

    def __post_init__(self) -> None:
        check(self)


# ----------------------------------------------------------------------------- help()

SETTINGS_DOC = "Settings (keyword arguments, each checked when the config is built):"


def settings_doc(cls: type) -> str:
    """``cls``'s docstring followed by every setting's type, default and help, read from its field and rule: what
    ``help(moquad.LoaderConfig)`` prints (the API page renders the same fields as a table)."""
    import inspect

    hints, lines = type_hints(cls), [inspect.cleandoc(cls.__doc__ or ""), "", SETTINGS_DOC]
    for f in fields(cls):
        tp = hints[f.name]
        kind = tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")
        default = f" = {f.default!r}" if f.default is not dataclasses.MISSING else ""
        text = f.metadata.get("help") or (f"The settings of {kind}." if is_dataclass(tp) else "")
        bounds = [f"{w} {f.metadata[k]}" for k, w in (("ge", ">="), ("gt", ">"), ("le", "<=")) if k in f.metadata]
        if "choices" in f.metadata:
            bounds.append("one of " + ", ".join(map(str, f.metadata["choices"])))
        lines += [f"  {f.name}: {kind}{default}", f"      {text}" + (f" ({'; '.join(bounds)})" if bounds else "")]
    return "\n".join(lines)


for _cls in (PreprocessConfig, LoaderConfig, PretrainConfig, LinearConfig, FinetuneConfig, EvalConfig, ExportConfig,
             MotionConfig):
    _cls.__doc__ = settings_doc(_cls)
