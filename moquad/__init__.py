"""moquad: self-supervised video representation learning with MoQuad, as a library.

``import moquad`` is cheap: it imports neither torch nor any stage. Each public name is looked up in
:data:`_API` (name -> ``"module:attribute"``) the first time it is used, so a name that moves is a one-line
change here. The stable names, one call each (the docs' "Use it from Python" page runs a whole loop)::

    import moquad

    cfg = moquad.LoaderConfig(frames=16, size=112)                      # how quadruples are built
    loader = moquad.make_loader("data/shards/ucf101", cfg, batch_size=32, epoch=0)  # the quadruple
    batch = next(iter(loader))
    views = moquad.to_model(batch, "cuda", cfg.size)                    # (B, V, 3, T, H, W), normalised
    z = my_net(views.flatten(0, 1)).reshape(*views.shape[:2], -1)
    loss, ranks = moquad.moquad_loss(z, batch["roles"], video=batch["index"])  # tau 0.1, beta 0.01, alpha 1.5
    warm = moquad.make_loader("data/shards/ucf101", cfg, batch_size=32, epoch=0,
                              views=moquad.speed_pair_views(cfg))          # the warm-up task's pairs (Eq. 3)
    loss, ranks = moquad.appearance_loss(z2)

    net = moquad.build_model("r3d_18", proj_dim=128, proj_hidden=2048)  # a row of moquad.BACKBONES
    ckpt = moquad.pretrain(moquad.resolve_config(moquad.PretrainConfig(), "ucf101_r3d18_moquad",
                                                 {"data": "data/shards/ucf101", "out": "runs/r3d18"}))
    ev = moquad.EvalConfig(data="data/shards/ucf101", checkpoint=str(ckpt))
    moquad.extract(ev, "test"); moquad.retrieve(ev); moquad.linear(ev); moquad.finetune(ev)
    report = moquad.motion_report("data/shards/ucf101", [moquad.load_encoder(f"mine={ckpt}")])

The command line (``moquad --help``) calls the same functions.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"  # the one place of the version (pyproject.toml reads it)

_API: dict[str, str] = {
    # settings
    "LoaderConfig": "moquad.config:LoaderConfig",
    "PretrainConfig": "moquad.config:PretrainConfig",
    "EvalConfig": "moquad.config:EvalConfig",
    "PreprocessConfig": "moquad.config:PreprocessConfig",
    "resolve_config": "moquad.settings:resolve",
    # data: shards -> quadruples
    "preprocess_dataset": "moquad.preprocess.run:preprocess",  # not "preprocess": the subpackage holds that name
    "make_synth": "moquad.synth:make_synth",
    "Split": "moquad.data.store:Split",
    "make_loader": "moquad.data.pipeline:make_loader",
    "to_model": "moquad.data.augment:to_model",
    "ViewPlan": "moquad.data.views:ViewPlan",
    "View": "moquad.data.views:View",
    "quadruple_views": "moquad.data.views:quadruple",  # the plans a method's stages name (loss names the same)
    "speed_pair_views": "moquad.data.views:speed_pair",
    "fixed_pair_views": "moquad.data.views:fixed_pair",
    "APPEARANCE_OPS": "moquad.data.ops:APPEARANCE_OPS",
    "MOTION_OPS": "moquad.data.ops:MOTION_OPS",
    "FLIP_POLICIES": "moquad.data.ops:FLIP_POLICIES",
    "DATASETS": "moquad.preprocess.datasets:DATASETS",
    # the method
    "METHODS": "moquad.train.methods:METHODS",
    "moquad_loss": "moquad.train.losses:moquad_loss",
    "appearance_loss": "moquad.train.losses:appearance_loss",
    "nt_xent_loss": "moquad.train.losses:nt_xent_loss",
    "momentum_loss": "moquad.train.losses:momentum_loss",
    "OPTIMIZERS": "moquad.train.optimizers:OPTIMIZERS",
    "BACKBONES": "moquad.models.backbones:BACKBONES",
    "build_backbone": "moquad.models.backbones:build_backbone",
    "build_model": "moquad.models.model:build_model",
    "VideoModel": "moquad.models.model:VideoModel",
    "pretrain": "moquad.train.loop:pretrain",
    "load_checkpoint": "moquad.train.checkpoint:load",
    # evaluation
    "PROTOCOLS": "moquad.eval.protocols:PROTOCOLS",
    "extract": "moquad.eval.features:extract",
    "compute_features": "moquad.eval.features:compute_features",
    "read_features": "moquad.eval.features:read_features",
    "retrieve": "moquad.eval.retrieve:retrieve",
    "prepare_features": "moquad.eval.search:prepare",
    "nearest": "moquad.eval.search:nearest",
    "knn_classify": "moquad.eval.retrieve:knn_classify",
    "linear": "moquad.eval.linear:linear",
    "finetune": "moquad.eval.finetune:finetune",
    "export_encoder": "moquad.export:export",  # not "export": the module holds that name
    # the motion report
    "load_encoder": "moquad.eval.encoders:load_encoder",
    "motion_report": "moquad.eval.motion:motion_report",
    "write_report": "moquad.eval.motion:write_report",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """Import the module that owns ``name`` on first use (PEP 562) and cache the attribute here."""
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'moquad' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names only (what ``dir(moquad)`` and tab completion show): ``__version__`` and ``_API``'s."""
    return sorted(__all__)
