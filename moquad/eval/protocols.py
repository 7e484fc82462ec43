"""The evaluation protocols: ONE table, name -> the protocol (what runs it, which settings it reads, what it needs).

Every evaluation command is a row: extract, retrieve, linear, attentive, finetune, cam and the motion report. A new
protocol is a module with a function ``f(cfg, **options)`` plus one row here; ``moquad.cli_eval`` builds its command
from the row (``--data``, ``--checkpoint`` when the row reads one (``--encoder``, the same option, where it reads any
encoder name of :mod:`moquad.eval.encoders`), ``--recipe`` when its config has recipes, and the row's settings as
named flags; every other setting stays reachable with ``--set``), and callers run it by name (:func:`run`). The function is imported when run, not when this table is read: the feature cache imports Lance,
which is not fork-safe, so it must load after any stage that forks (``moquad quickstart``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moquad.config import EvalConfig, MotionConfig

# the test views of every protocol that reads clips (EvalConfig's top level)
VIEWS = ("num_clips", "frames", "dilation", "size", "crops", "out", "device")
# the splits a protocol trains (retrieval: gallery) and tests (retrieval: queries) on
SPLITS = ("train_split", "test_split")


def _always(cfg: Any) -> bool:
    return True


def _unless_random_init(cfg: EvalConfig) -> bool:
    """Fine-tuning from random init (the supervised bound) reads no checkpoint."""
    return cfg.finetune.init != "random"


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: ``module.function(cfg, **options)``, its summary, its named flags, the config its
    settings live in, and what a run needs."""

    module: str
    function: str
    summary: str
    flags: tuple[str, ...]  # settings of ``config`` (dotted for nested ones) with a named command-line flag
    config: type = EvalConfig
    # whether a run of this config needs ``--checkpoint``; None: the protocol takes no checkpoint (the motion report
    # names its encoders as arguments). With a checkpoint, the clip settings left unset are its pre-training clip.
    needs_checkpoint: Callable[[Any], bool] | None = _always
    needs_data: bool = True  # False: --data is optional (cam: only to find a video_id)
    # whether ``--checkpoint`` (``--encoder``) takes any encoder name (moquad.eval.encoders), not only a checkpoint;
    # an encoder's native clip then fills the clip settings left unset
    encoders: bool = True
    results: bool = True  # writes its result to the evaluation folder (False: cam writes beside its image)

    def runner(self) -> Callable[..., Any]:
        """The function that runs the protocol (imported now)."""
        return getattr(importlib.import_module(self.module), self.function)


PROTOCOLS: dict[str, Protocol] = {
    "extract": Protocol("moquad.eval.features", "extract",
                        "per-video backbone features (multi-clip average), cached as Lance",
                        (*VIEWS, "batch_size")),
    "attentive": Protocol("moquad.eval.attentive", "attentive",
                          "attentive probe (V-JEPA 2's: a learnt query over the frozen tokens), multi-clip test",
                          (*SPLITS, *VIEWS, "attentive.epochs", "attentive.lr", "attentive.weight_decay",
                           "attentive.batch_size", "attentive.depth", "attentive.heads")),
    "retrieve": Protocol("moquad.eval.retrieve", "retrieve",
                         "test-split videos query the train split: hit@k, and DINO's weighted kNN top-1/5",
                         (*SPLITS, *VIEWS, "center", "index", "knn_k", "knn_t")),
    "linear": Protocol("moquad.eval.linear", "linear",
                       "linear probe on the frozen backbone (--fast: cached features; --full: CVRL on clips)",
                       (*SPLITS, *VIEWS, "linear.epochs", "linear.lr", "linear.batch_size")),
    "finetune": Protocol("moquad.eval.finetune", "finetune",
                         "fine-tune the whole network (from the checkpoint or random init), multi-view test",
                         (*SPLITS, *VIEWS, "finetune.init", "finetune.backbone", "finetune.epochs", "finetune.lr",
                          "finetune.batch_size"), needs_checkpoint=_unless_random_init),
    "cam": Protocol("moquad.eval.cam", "cam", "class-activation maps over a video's frames (the paper's Fig. 5)",
                    ("frames", "size", "out", "device"), needs_data=False, results=False),
    "motion": Protocol("moquad.eval.motion", "report",
                       "arrow of time, speed, mirror, appearance share and direction pairs of frozen encoders",
                       ("out", "split", "frames", "size", "dilation", "max_videos", "pair", "knn_k", "seed",
                        "batch_size", "workers", "device", "threads"), MotionConfig, needs_checkpoint=None),
}


def run(name: str, cfg: Any, **options: Any) -> Any:
    """Run protocol ``name`` of :data:`PROTOCOLS` on ``cfg`` (its row's config); ``options``: the protocol's own
    keywords (``split`` of extract, ``json_path`` of retrieve, ``fast`` of linear, ``video`` and ``out`` of cam,
    ``encoders`` of motion ...).

    A protocol that reads an encoder gets it resolved ONCE, here (``encoder=``: the
    :class:`moquad.eval.encoders.Encoder` ``cfg.checkpoint`` names: a moquad checkpoint or export,
    ``torchvision:ARCH[:WEIGHTS]``, ``hf:NAME``), with the clip settings ``cfg`` leaves unset taken from its clip (a
    checkpoint's: its pre-training clip, and one set to something else prints one warning line naming both); a clip
    it cannot take is the one-line error (:func:`moquad.eval.common.with_clip`). The motion report resolves each of
    its encoders once itself and warns the same way (:func:`moquad.eval.motion.clip_warnings`)."""
    row = PROTOCOLS[name]
    if row.needs_checkpoint is not None:
        from moquad.eval.common import encoder_of, with_clip  # imports torch: not when the table is read

        encoder = encoder_of(cfg)
        cfg = with_clip(cfg, encoder, warn=True)
        if encoder is not None:
            options["encoder"] = encoder
    return row.runner()(cfg=cfg, **options)
