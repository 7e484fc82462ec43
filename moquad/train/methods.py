"""Pre-training methods (``cfg.method``): ONE table, :data:`METHODS`; a row is everything a method is.

A :class:`Method` is its stages (Algorithm 1: a method with two stages trains the first, the appearance warm-up of
Eq. 3, for epochs ``e < warmup_ratio * epochs``, the second after), each stage a view plan (a function of the
loader settings giving a :class:`moquad.data.views.ViewPlan`: each view's role and the ops that make it) and a
loss over those roles (:mod:`moquad.train.losses`), and an optional momentum encoder (:mod:`moquad.train.momentum`).
Adding a method is one row here, its new code in one new module (``tests/test_methods_extension.py`` adds a
BYOL-style method that way).

  - ``moquad``: the appearance warm-up, then MoQuad's quadruple (Eq. 1 / Eq. 4, the ablation switches
    ``loader.ad_pos / intra_neg / ad_intra_neg`` as configured);
  - ``simclr``: the SimCLR BASE of the ladder: exactly ``moquad`` with the three switches off (anchor + plain
    positive at the same random speed, the same one-directional loss, warm-up and mining), so each rung of the
    ladder changes one thing;
  - ``simclr_classic``: SimCLR as published: two clips at ``loader.simclr_dilation``, symmetric NT-Xent, no warm-up;
  - ``moco``: the MoCo v2/v3-style base: anchor (online) vs its plain positive through the momentum encoder,
    InfoNCE over the other videos' keys of the global batch and the queue, no warm-up, no mining;
  - ``moco_moquad``: MoQuad on that base: the warm-up (Eq. 3 on the momentum base), then the AD-Pos as the key,
    the Intra-Neg and AD-Intra-Neg keys in the denominator, Eq. 4 mining over batch and queue
    (design choices: :mod:`moquad.train.momentum`).
Imports no torch (``moquad.settings`` reads the table's names to check the setting).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from moquad.data import views

NO_QUADRUPLE = {"ad_pos": False, "intra_neg": False, "ad_intra_neg": False}


@dataclass(frozen=True)
class Stage:
    """One stage of a method: ``name`` (the log's ``mode``), its views (``views(loader_cfg) -> ViewPlan``, under
    the loader switches ``switches`` it forces), its loss (``moquad.train.losses``, named by its function name: the
    table imports no torch) and what the progress bar calls that loss."""

    name: str
    views: Callable[[Any], views.ViewPlan]
    loss: str | Callable  # "module:function" (the shipped rows: this table imports no torch) or the function
    label: str
    switches: dict[str, bool] = field(default_factory=dict)

    def loader_config(self, loader: Any) -> Any:
        """The run's ``LoaderConfig`` under this stage's switches: what its loader reads and its plan is built from."""
        return replace(loader, **self.switches)


@dataclass(frozen=True)
class Momentum:
    """A momentum (EMA) encoder slot and its routing: the views whose role is in ``online`` go through the online
    network (the queries, with gradients), those in ``keys`` through an EMA copy of the encoder and projection
    (no gradients), and the keys of the roles in ``queue`` enter a queue of negatives (empty: no queue, e.g.
    BYOL). A role may be in both ``online`` and ``keys`` (MoCo v3's symmetric loss: each of anchor and positive
    queries the other's key). ``predictor``: an MLP on the online projections (BYOL, MoCo v3); ``key_bn``: how
    the keys' BatchNorm statistics are taken (``moquad.config.KEY_BN``). Sizes and the EMA schedule come from the
    config; the config's ``symmetric`` / ``predictor`` / ``key_bn``, when set, override the row
    (:meth:`Method.configured`)."""

    online: tuple[str, ...] = ("anchor",)
    keys: tuple[str, ...] = ("positive", "intra_negative")
    queue: tuple[str, ...] = ("positive",)
    predictor: bool = False
    key_bn: str = "batch"

    @property
    def symmetric(self) -> bool:
        return "positive" in self.online

    def with_symmetric(self, on: bool) -> Momentum:
        """This routing with the positive also a query (and the anchor also a key, both queued), or without."""
        if on == self.symmetric:
            return self
        pair = ("anchor", "positive")
        if on:
            return replace(self, online=pair, keys=(*pair, *(r for r in self.keys if r not in pair)),
                           queue=tuple(dict.fromkeys((*self.queue, *pair))) if self.queue else ())
        return replace(self, online=("anchor",), keys=tuple(r for r in self.keys if r != "anchor"),
                       queue=tuple(r for r in self.queue if r != "anchor"))


@dataclass(frozen=True)
class Method:
    """A pre-training method: one or two stages (two: the first is the warm-up) and an optional momentum slot."""

    stages: tuple[Stage, ...]
    momentum: Momentum | None = None

    def stage(self, kind: str) -> Stage:
        """The stage of an epoch whose Algorithm 1 task (``moquad.train.schedule.stage``) is ``kind``."""
        return self.stages[0] if kind == "appearance" and len(self.stages) > 1 else self.stages[-1]

    @property
    def warmup(self) -> bool:
        return len(self.stages) > 1

    def configured(self, cfg: Any) -> Method:
        """This row under a run's config: the momentum slot's choices the config sets (``symmetric``,
        ``predictor``, ``key_bn``; None: the row's) applied."""
        m = self.momentum
        if m is None:
            return self
        if getattr(cfg, "symmetric", None) is not None:
            m = m.with_symmetric(cfg.symmetric)
        if getattr(cfg, "predictor", None) is not None:
            m = replace(m, predictor=cfg.predictor)
        if getattr(cfg, "key_bn", None) is not None:
            m = replace(m, key_bn=cfg.key_bn)
        return replace(self, momentum=m)


def _loss(module: str, name: str) -> str:
    return f"{module}:{name}"


WARMUP = Stage("appearance", views.speed_pair, _loss("moquad.train.losses", "speed_pair"), "appearance")
QUADRUPLE = Stage("moquad", views.quadruple, _loss("moquad.train.losses", "quadruple"), "moquad")
MOCO_WARMUP = Stage("appearance", views.speed_pair, _loss("moquad.train.losses", "momentum_plain"), "appearance")

METHODS: dict[str, Method] = {
    "moquad": Method((WARMUP, QUADRUPLE)),
    "simclr": Method((WARMUP, Stage("moquad", views.quadruple, QUADRUPLE.loss, "simclr", NO_QUADRUPLE))),
    "simclr_classic": Method((Stage("pair", views.fixed_pair, _loss("moquad.train.losses", "nt_xent"), "simclr"),)),
    "moco": Method((Stage("moco", views.quadruple, _loss("moquad.train.losses", "momentum_plain"), "moco",
                          NO_QUADRUPLE),), Momentum()),
    "moco_moquad": Method((MOCO_WARMUP, Stage("moquad", views.quadruple,
                                              _loss("moquad.train.losses", "momentum_contrast"), "moco_moquad")),
                          Momentum()),
}


def resolve(loss: str | Callable) -> Callable:
    """The loss function a stage names (``module:name``, imported now) or holds."""
    import importlib

    if callable(loss):
        return loss
    module, _, name = loss.partition(":")
    return getattr(importlib.import_module(module), name)
