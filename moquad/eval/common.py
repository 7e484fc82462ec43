"""Shared plumbing of the evaluation stage: device and ranks, the run-folder layout, the splits a protocol uses,
the encoder a protocol evaluates (``EvalConfig.checkpoint``: a moquad checkpoint, or any name of the encoder table
:mod:`moquad.eval.encoders`) and its hash, the clip a protocol evaluates at (the checkpoint's pre-training clip, an
encoder's native clip, unless set) and what a result records of it, the frozen-backbone check."""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moquad import dist
from moquad.config import EvalConfig
from moquad.data.store import Split, classes
from moquad.errors import MoquadError
from moquad.eval.clips import PretrainClip, pretrain_clip
from moquad.eval.encoders import Encoder, load_encoder

CLIP_KEYS = ("frames", "size", "dilation")  # EvalConfig's clip settings: None = the checkpoint's


def resolve_device(name: str) -> torch.device:
    """``auto`` -> this rank's CUDA device when available, else CPU."""
    return dist.pick_device(name, dist.env_ranks()[1])


def dist_env() -> tuple[int, int]:
    """(rank, world_size); starts the process group from torchrun's environment when needed."""
    if dist.is_dist():
        return dist.get_rank(), dist.get_world_size()
    if dist.env_ranks()[2] > 1:
        info = dist.init("cpu" if not torch.cuda.is_available() else "auto")
        return info.rank, info.world_size
    return 0, 1


def frozen_encoder(name: str) -> Encoder:
    """The frozen :class:`moquad.eval.encoders.Encoder` a name means, loaded once per name and file version (a
    command resolves it once; a library call that resolves it again gets the same one): do not train it
    (fine-tuning trains a copy, :meth:`Encoder.trainable`)."""
    path = Path(name if Path(name).exists() else name.rpartition(":")[2])
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path] if path.is_file() else []
    return _encoder(name, tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=2)
def _encoder(name: str, _stamp: Any) -> Encoder:
    return load_encoder(name)


def encoder_of(cfg: EvalConfig, encoder: Encoder | None = None) -> Encoder | None:
    """The encoder a protocol evaluates: ``encoder`` when its command resolved it, else the one ``cfg.checkpoint``
    names (:func:`frozen_encoder`); None without a name (fine-tuning from random init)."""
    if encoder is not None or not cfg.checkpoint:
        return encoder
    return frozen_encoder(cfg.checkpoint)


def need_encoder(cfg: EvalConfig, encoder: Encoder | None, task: str) -> Encoder:
    """:func:`encoder_of`, or the one-line error of a protocol that has no encoder to evaluate."""
    found = encoder_of(cfg, encoder)
    if found is None:
        raise MoquadError(f"{task} needs an encoder; pass --encoder RUN/checkpoints/last.pt (or another encoder name)")
    return found


def with_clip(cfg: EvalConfig, encoder: Encoder | None = None, *, warn: bool = False) -> EvalConfig:
    """``cfg`` with each clip setting left unset (None) taken from the encoder's clip (a moquad checkpoint's: its
    pre-training clip; another's: its native clip; none: the paper's 16 x 224 at dilation 2), and the one-line
    error when the encoder cannot take the result. ``warn``: one ``warning:`` line on stderr when a setting given
    by a flag or a recipe differs from the clip a checkpoint was pre-trained at, naming both and who set it (the
    commands warn, once). ``encoder``: the one the command resolved (default: the one ``cfg.checkpoint`` names)."""
    encoder = encoder_of(cfg, encoder)
    if encoder is None:
        clip = pretrain_clip(None)
        return dataclasses.replace(cfg, **{k: getattr(clip, k) for k in CLIP_KEYS if getattr(cfg, k) is None})
    filled = encoder.fill(cfg)
    line = clip_warning(filled, encoder.pretrained, cfg.recipe) if warn and encoder.pretrained else None
    if line and dist.env_ranks()[0] == 0:  # one line, not one per rank under torchrun
        print(line, file=sys.stderr, flush=True)
    return filled


def clip_warning(cfg: Any, trained: PretrainClip, recipe: str | None = None, *, who: str | None = None,
                 encoder: str = "the encoder", native: bool = False) -> str | None:
    """``warning: evaluating at 16x224 but the encoder was pre-trained at 8x32 (--frames/--size set it)`` when
    ``cfg``'s frames / size / dilation (any object with those; dilation None: not compared) differ from
    ``trained``; else None. A setting ``recipe`` gives is named as the recipe's (``recipe
    eval/linear_ucf101.yaml sets frames``); ``who`` replaces the whole "who set it" part."""
    if trained.matches(cfg.frames, cfg.size, getattr(cfg, "dilation", None)):
        return None
    differ = [k for k in ("frames", "size") if getattr(cfg, k) != getattr(trained, k)]
    if getattr(cfg, "dilation", None) is not None and not trained.fits(cfg.dilation):
        differ.append("dilation")

    def at(frames: int, size: int, dilation: Any) -> str:
        return f"{frames}x{size}" + (f" at dilation {dilation}" if "dilation" in differ else "")

    given = _recipe_values(recipe)
    by_recipe = [k for k in differ if given.get(k) == getattr(cfg, k)]
    flags = [f"--{k}" for k in differ if k not in by_recipe]
    who = who or "; ".join(([f"recipe {recipe} sets {', '.join(by_recipe)}"] if by_recipe else []) + (
        [f"{'/'.join(flags)} set{'s' if len(flags) == 1 else ''} it"] if flags else []))
    was = f"{encoder}'s native clip is" if native else f"{encoder} was pre-trained at"  # native: another family's
    return (f"warning: evaluating at {at(cfg.frames, cfg.size, cfg.dilation)} but {was} "
            f"{at(trained.frames, trained.size, ','.join(map(str, trained.dilations)))} ({who})")


def _recipe_values(recipe: str | None) -> dict[str, Any]:
    if not recipe:
        return {}
    from moquad.recipes import find_recipe, load_recipe

    try:
        return load_recipe(find_recipe(recipe, "eval"))
    except (OSError, ValueError):
        return {}


def run_folder(checkpoint: str | Path) -> Path:
    """The run folder a checkpoint belongs to: ``RUN`` of ``RUN/checkpoints/last.pt``, else the file's folder."""
    ckpt = Path(checkpoint)
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def eval_folder(checkpoint: str | Path) -> Path:
    """``RUN/eval``: where the evaluations of a checkpoint go by default (``moquad export`` reads them there)."""
    return run_folder(checkpoint) / "eval"


def out_dir(cfg: EvalConfig) -> Path:
    """``cfg.out``, else ``RUN/eval`` next to the checkpoint's run folder."""
    if cfg.out:
        return Path(cfg.out)
    if not cfg.checkpoint:
        raise MoquadError("no checkpoint to put the results beside; pass --out DIR")
    if not Path(cfg.checkpoint).is_file():  # torchvision:ARCH, hf:NAME: no file, so no run folder
        raise MoquadError(f"encoder {cfg.checkpoint} has no run folder to put the results beside; pass --out DIR")
    return eval_folder(cfg.checkpoint)


def _test_split(cfg: EvalConfig, task: str) -> Split:
    """``cfg.test_split`` of ``cfg.data``; a dataset whose videos are all in train (a folder preprocessed without
    ``--split-ratios``) gets the fix preprocessing printed, again."""
    from moquad import objstore
    from moquad.preprocess.splits import NO_TEST_SPLIT_FIX

    try:
        return Split(cfg.data, cfg.test_split)
    except FileNotFoundError:
        splits = {n for n in objstore.listdir(objstore.join(cfg.data, "manifests")) if n.endswith(".parquet")}
        if splits - {"errors.parquet"} != {"train.parquet"}:
            raise  # another split is missing: the store's message names those there are
    raise MoquadError(f"{cfg.data} has no {cfg.test_split!r} split: every video is in train, and {task} needs a "
                      f"test split: {NO_TEST_SPLIT_FIX} (or pass --test-split with a split it has)")


def result_path(cfg: EvalConfig, name: str, overwrite: bool) -> Path:
    """Where a protocol writes its result ``name`` (the evaluation folder: ``cfg.out``, else ``RUN/eval``). One
    that exists is replaced only with ``overwrite`` (the commands pass it: running one again replaces its result
    and says where it wrote), so a Python call never silently replaces a result; asked before the work starts."""
    path = out_dir(cfg) / name
    if path.exists() and not overwrite:
        raise MoquadError(f"{path} exists (a result written earlier); pass overwrite=True to replace it, or set "
                          "EvalConfig.out to write the result elsewhere")
    return path


def labelled_splits(cfg: EvalConfig, task: str) -> tuple[Split, Split]:
    """The (train, test) splits ``cfg`` names, each with labelled videos; else the error a user acts on
    (a protocol over 0 labelled videos gives no number, e.g. SSv2's unlabelled test split)."""
    splits = Split(cfg.data, cfg.train_split), _test_split(cfg, task)
    for split, flag in zip(splits, ("--train-split", "--test-split")):
        if not (split.label >= 0).any():
            raise MoquadError(f"{task} needs labelled videos, and split {split.split!r} of {cfg.data} has none "
                              f"(0 of {len(split)}); pass {flag} with a labelled split (SSv2 and K400: val, as "
                              "their eval recipes set)")
    return splits


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copy of every parameter AND buffer (BN running mean/var, num_batches_tracked)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def check_unchanged(module: nn.Module, before: dict[str, torch.Tensor], what: str = "backbone") -> None:
    """moco-style sanity check: raise if any weight or BN statistic differs from ``before``."""
    now = module.state_dict()
    changed = [k for k, v in before.items() if k not in now or not torch.equal(now[k].detach().cpu(), v.cpu())]
    if changed or set(now) != set(before):
        raise RuntimeError(f"the frozen {what} changed during evaluation ({', '.join(changed[:5])}...); "
                           "the result is invalid: weights or BN statistics must stay as in the checkpoint")


@dataclasses.dataclass
class Start:
    """What a protocol starts from: its encoder (None: fine-tuning from random init with no name), ``cfg`` with its
    clip filled, where its result goes, and its labelled (train, test) splits."""

    encoder: Encoder | None
    cfg: EvalConfig
    path: Path
    train: Split
    test: Split
    device: torch.device
    classes: list[str]
    rank: int = 0
    world: int = 1


def start(cfg: EvalConfig, encoder: Encoder | None, result: str, overwrite: bool, task: str, *,
          need: bool = True) -> Start:
    """A protocol's start in one place: the encoder its command resolved (default: the one ``cfg.checkpoint`` names;
    ``need``: none is the one-line error), where its result ``result`` goes (:func:`result_path`), ``cfg`` with the
    clip settings it leaves unset filled from the encoder (:func:`with_clip`), its labelled splits, its device and
    its rank among ``world`` (the process group started from torchrun's environment when needed)."""
    encoder = need_encoder(cfg, encoder, task) if need else encoder_of(cfg, encoder)
    path = result_path(cfg, result, overwrite)
    cfg = with_clip(cfg, encoder)
    train, test = labelled_splits(cfg, task)
    return Start(encoder, cfg, path, train, test, resolve_device(cfg.device), classes(cfg.data), *dist_env())
