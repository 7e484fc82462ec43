"""Pre-training methods (``cfg.method``): ONE table, :data:`METHODS`; a row is everything a method is.

A :class:`Method` is its stages (each of a kind: Algorithm 1 trains the :data:`WARMUP` stage, the appearance task
of Eq. 3, for epochs ``e < warmup_ratio * epochs``, the :data:`MAIN` one after), each stage a view plan (a function
of the loader settings giving a :class:`moquad.data.views.ViewPlan`: each view's role and the ops that make it), a
loss over those roles (:mod:`moquad.train.losses`) and that loss's hyperparameters (``params(cfg)``), and an
optional momentum encoder with its routing (:class:`Momentum`, :mod:`moquad.train.momentum`). The rest of the
product asks the row (dilations, candidate counts, help texts); no other module names a method or a stage. Adding
a method is one row here, its new code in one new module (``tests/test_methods_extension.py`` adds a symmetric
BYOL and a DINO-style method that way).

  - ``moquad``: the appearance warm-up, then MoQuad's quadruple (Eq. 1 / Eq. 4, the ablation switches
    ``loader.ad_pos / intra_neg / ad_intra_neg`` as configured);
  - ``simclr``: the SimCLR BASE of the ladder: exactly ``moquad`` with the three switches off (anchor + plain
    positive at the same random speed, the same one-directional loss, warm-up and mining), so each rung of the
    ladder changes one thing;
  - ``simclr_classic``: SimCLR as published: two clips at ``loader.simclr_dilation``, symmetric NT-Xent, no warm-up;
  - ``moco``: the MoCo v2/v3-style base: anchor (online, through a predictor) vs its plain positive through the
    momentum encoder (keys normalised in groups), InfoNCE over the other videos' keys of the global batch and the
    queue, no warm-up, no mining;
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

WARMUP, MAIN = "warm-up", "main"  # a stage's kind: Algorithm 1 trains the warm-up for e < p * E, the main stage after


def tau(cfg: Any) -> dict[str, Any]:
    """The hyperparameters of a loss with a temperature only: the run's ``temperature``."""
    return {"tau": cfg.temperature}


def mined(cfg: Any) -> dict[str, Any]:
    """The hyperparameters of a loss with Eq. 4 mining: ``temperature``, ``hard_beta``, ``hard_alpha``."""
    return {"tau": cfg.temperature, "hard_beta": cfg.hard_beta, "hard_alpha": cfg.hard_alpha}


@dataclass(frozen=True)
class Stage:
    """One stage of a method: ``name`` (the log's ``mode``), its ``kind`` (:data:`WARMUP` or :data:`MAIN`), its
    views (``views(loader_cfg) -> ViewPlan``, under the loader switches ``switches`` it forces), its loss and what
    the progress bar calls that loss. ``loss``: ``"module:name"`` (the shipped rows: this table imports no torch)
    or the object itself: a function ``loss(p, **params) -> (loss, Fig. 4 ranks)`` of a
    :class:`moquad.train.losses.Projections`, or a class whose instances are such functions and keep state
    (``state_dict`` / ``load_state_dict``, e.g. an EMA centre: the trainer makes one per run and checkpoints it).
    ``params(cfg)``: the loss's own hyperparameters, read from the run's config (or constants of the row)."""

    name: str
    views: Callable[[Any], views.ViewPlan]
    loss: str | Callable
    label: str
    switches: dict[str, bool] = field(default_factory=dict)
    kind: str = MAIN
    params: Callable[[Any], dict[str, Any]] = mined

    def loader_config(self, loader: Any) -> Any:
        """The run's ``LoaderConfig`` under this stage's switches: what its loader reads and its plan is built from."""
        return replace(loader, **self.switches)

    def plan(self, loader: Any) -> views.ViewPlan:
        """This stage's views under the run's loader settings (and its switches)."""
        return self.views(self.loader_config(loader))


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
    """A pre-training method: its stages (at most one of kind :data:`WARMUP`, trained first), an optional momentum
    slot, and a one-line ``summary`` (the ``--method`` help and the docs' table are made from it)."""

    stages: tuple[Stage, ...]
    momentum: Momentum | None = None
    summary: str = ""

    def stage(self, kind: str) -> Stage:
        """The stage of kind ``kind``; a method without a warm-up trains its main stage in those epochs too."""
        return next((s for s in self.stages if s.kind == kind), self.stages[-1])

    @property
    def warmup(self) -> bool:
        return any(s.kind == WARMUP for s in self.stages)

    def epoch_stages(self, epochs: int, warmup_ratio: float) -> list[Stage]:
        """Algorithm 1: each epoch's stage, the warm-up for epochs ``e < warmup_ratio * epochs`` (if it has one)."""
        if not 0.0 <= warmup_ratio <= 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}")
        ratio = warmup_ratio if self.warmup else 0.0
        return [self.stage(WARMUP if e < ratio * epochs else MAIN) for e in range(epochs)]

    def named(self, mode: str) -> Stage | None:
        """The stage a log record's ``mode`` names (None: not one of this method's)."""
        return next((s for s in self.stages if s.name == mode), None)

    def dilations(self, loader: Any) -> tuple[int, ...]:
        """The dilations this method's clips are drawn at under ``loader``: its plans' speeds (``n`` / ``m``: the
        loader's ``dilations``; ``fixed``: ``simclr_dilation``), what evaluation clamps its dilation to."""
        speeds = {v.speed for s in self.stages for v in s.plan(loader).views}
        out = set(loader.dilations) if speeds & {"n", "m"} else set()
        return tuple(sorted(out | ({loader.simclr_dilation} if "fixed" in speeds else set())))

    def candidates(self, stage: Stage, cfg: Any) -> int:
        """How many candidates an anchor ranks in a step of ``stage`` (the Fig. 4 ranks' range, chance at half):
        every other view of the global batch, ``batch x views - 1``; with a momentum slot the anchor's keys (all
        key views but its own view's) of every video of the global batch, plus the queue once it is full."""
        roles, m = stage.plan(cfg.loader).roles, self.momentum
        if m is None:
            return cfg.batch_size * len(roles) - 1
        keys = sum(r in m.keys and r != "anchor" for r in roles)
        return cfg.batch_size * keys + (cfg.queue_size if m.queue else 0)

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


LOSSES = "moquad.train.losses"
# the momentum slots: each row's setting is the one of highest mean kNN and linear over the three families, 3 seeds
# each (docs/guides/methods.md, "Choosing the momentum defaults on every family"; tests/test_ladder_tables.py)
MOMENTUM = Momentum(
    online=("anchor",), keys=("positive", "intra_negative"), queue=("positive",),  # MoCo v1/v2: one query, its keys
    predictor=True,  # MoCo v3 / BYOL: an MLP predictor on the online side
    key_bn="groups",  # each group of key_bn_group videos apart, queries over the batch (not MoCo's shuffle-BN: split)
)  # moco_moquad's: 43.7 against 38.8 for the first defaults (random init 33.2)
MOCO_MOMENTUM = replace(MOMENTUM, predictor=False, key_bn="batch")  # moco's: the first defaults, 36.0 against 35.6
APPEARANCE = Stage("appearance", views.speed_pair, _loss(LOSSES, "speed_pair"), "appearance", kind=WARMUP, params=tau)
QUADRUPLE = Stage("moquad", views.quadruple, _loss(LOSSES, "quadruple"), "moquad")
MOCO_APPEARANCE = Stage("appearance", views.speed_pair, _loss(LOSSES, "momentum_plain"), "appearance", kind=WARMUP,
                        params=tau)

METHODS: dict[str, Method] = {
    "moquad": Method((APPEARANCE, QUADRUPLE), summary="MoQuad: the appearance warm-up, then the quadruple (Eq. 1 / "
                     "Eq. 4)"),
    "simclr": Method((APPEARANCE, Stage("moquad", views.quadruple, QUADRUPLE.loss, "simclr", NO_QUADRUPLE)),
                     summary="the ladder's SimCLR base: MoQuad with no quadruple parts (anchor and plain positive)"),
    "simclr_classic": Method((Stage("pair", views.fixed_pair, _loss(LOSSES, "nt_xent"), "simclr", params=tau),),
                             summary="SimCLR as published: two clips at one dilation, NT-Xent, no warm-up"),
    "moco": Method((Stage("moco", views.quadruple, _loss(LOSSES, "momentum_plain"), "moco", NO_QUADRUPLE,
                          params=tau),), MOCO_MOMENTUM,
                   summary="the momentum base: a momentum encoder's keys and a queue of negatives (MoCo)"),
    "moco_moquad": Method((MOCO_APPEARANCE, Stage("moquad", views.quadruple, _loss(LOSSES, "momentum_contrast"),
                                                  "moco_moquad")), MOMENTUM,
                          summary="MoQuad on the momentum base"),
}


DEMO = ("simclr", "moquad")  # what `moquad quickstart` compares: the SimCLR base, then MoQuad on it


def help_text() -> str:
    """The methods, one ``name: summary`` each: what the ``--method`` help and the docs list."""
    return "; ".join(f"{name}: {m.summary}" for name, m in METHODS.items())


def markdown() -> str:
    """The docs' table of methods (docs/guides/methods.md holds it; its test regenerates it)."""
    rows = ["| method | what it is | stages | momentum encoder |", "|---|---|---|---|"]
    for name, m in METHODS.items():
        stages = ", then ".join(f"{s.name} ({s.kind})" for s in m.stages)
        slot = "–" if m.momentum is None else (f"queries {', '.join(m.momentum.online)}; keys "
                                               f"{', '.join(m.momentum.keys)}; queue "
                                               f"{', '.join(m.momentum.queue) or 'none'}; BN of keys "
                                               f"{m.momentum.key_bn}" + ("; predictor" if m.momentum.predictor else ""))
        rows.append(f"| `{name}` | {m.summary} | {stages} | {slot} |")
    return "\n".join(rows)


def resolve(loss: str | Callable) -> Callable:
    """The loss a stage names (``module:name``, imported now) or holds: a function, or a class of stateful
    losses (the trainer makes its instance)."""
    import importlib

    if callable(loss):
        return loss
    module, _, name = loss.partition(":")
    return getattr(importlib.import_module(module), name)
