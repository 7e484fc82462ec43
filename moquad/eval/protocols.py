"""The evaluation protocols: ONE table, name -> the protocol (what runs it, which settings it reads).

A new protocol is a module with a function ``f(cfg: EvalConfig, **options)`` plus one row here;
``moquad.cli_eval`` builds its command's named flags from the row (every other setting stays
reachable with ``--set``), and callers run it by name (:func:`run`). The function is imported when
run, not when this table is read: the feature cache imports Lance, which is not fork-safe, so it
must load after any stage that forks (``moquad quickstart``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moquad.config import EvalConfig

# the test views of every protocol that reads clips (EvalConfig's top level)
VIEWS = ("num_clips", "frames", "dilation", "size", "crops", "out", "device")
# the splits a protocol trains (retrieval: gallery) and tests (retrieval: queries) on
SPLITS = ("train_split", "test_split")


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: ``module.function(cfg, **options)``, its summary, its named flags."""

    module: str
    function: str
    summary: str
    flags: tuple[str, ...]  # EvalConfig settings (dotted for nested ones) with a named command-line flag

    def runner(self) -> Callable[..., Any]:
        """The function that runs the protocol (imported now)."""
        return getattr(importlib.import_module(self.module), self.function)


PROTOCOLS: dict[str, Protocol] = {
    "extract": Protocol("moquad.eval.features", "extract",
                        "per-video backbone features (multi-clip average), cached as Lance",
                        (*VIEWS, "batch_size")),
    "retrieve": Protocol("moquad.eval.retrieve", "retrieve",
                         "test-split videos query the train split: hit@k, and DINO's weighted kNN top-1/5",
                         (*SPLITS, *VIEWS, "center", "index", "knn_k", "knn_t")),
    "linear": Protocol("moquad.eval.linear", "linear",
                       "linear probe on the frozen backbone (--fast: cached features; --full: CVRL on clips)",
                       (*SPLITS, *VIEWS, "linear.epochs", "linear.lr", "linear.batch_size")),
    "finetune": Protocol("moquad.eval.finetune", "finetune",
                         "fine-tune the whole network (from the checkpoint or random init), multi-view test",
                         (*SPLITS, *VIEWS, "finetune.init", "finetune.backbone", "finetune.epochs", "finetune.lr",
                          "finetune.batch_size")),
    "cam": Protocol("moquad.eval.cam", "cam", "class-activation maps over a video's frames (the paper's Fig. 5)",
                    ("frames", "size", "device")),
}


def run(name: str, cfg: EvalConfig, **options: Any) -> Any:
    """Run protocol ``name`` of :data:`PROTOCOLS` on ``cfg``; ``options``: the protocol's own keywords
    (``split`` of extract, ``json_path`` of retrieve, ``fast`` of linear, ``video`` and ``out`` of cam ...).

    The clip settings ``cfg`` leaves unset are the checkpoint's pre-training clip; one set to something else
    prints one warning line naming both (:func:`moquad.eval.common.with_clip`)."""
    from moquad.eval.common import with_clip  # imports torch: not when the table is read

    return PROTOCOLS[name].runner()(cfg=with_clip(cfg, warn=True), **options)
