"""Linear evaluation on a frozen backbone.

Two variants, both recorded in the result:

- ``fast=True``: multinomial logistic regression on the cached video features of
  :func:`moquad.eval.features.extract` (mean over test-time clips), standardised with the
  train mean/std, L2 penalty ``cfg.linear.l2``, fitted to convergence with full-batch L-BFGS
  (deterministic: a convex problem started from zero). Minutes on CPU for UCF101.
- ``fast=False``: the CVRL protocol: clips of ``cfg.frames`` frames at ``cfg.dilation``
  (eval/linear_*.yaml: 32 at 2), a random clip per video per epoch with random crop + flip,
  the backbone frozen in eval mode (no gradient, BN uses and keeps its running statistics),
  a linear layer trained as ``cfg.linear`` says (epochs, optimizer, lr, batch, weight decay)
  with a half-period cosine; test = ``cfg.num_clips`` x ``cfg.crops`` views per video, softmax averaged per video.

Either way the backbone is snapshotted (weights and BN buffers) before and compared
bit-for-bit afterwards; any difference raises (the moco ``sanity_check``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import Progress
from torch import nn

from moquad.config import EvalConfig
from moquad.data import store
from moquad.data.augment import normalize
from moquad.data.store import Split
from moquad.eval.clips import TestViews, TrainClips, labelled
from moquad.eval.common import (
    check_unchanged,
    resolve_device,
    snapshot,
    start,
)
from moquad.eval.encoders import Encoder
from moquad.eval.report import (
    accuracy_report,
    accuracy_tables,
    finish,
    protocol_table,
    provenance,
)
from moquad.train.optimizers import make_optimizer
from moquad.train.schedule import lr_schedule


def fit_logistic(x: np.ndarray, y: np.ndarray, num_classes: int, weight_decay: float, max_iter: int = 500,
                 device: torch.device | str = "cpu") -> nn.Linear:
    """Multinomial logistic regression (float64, L-BFGS, zero init) -> fitted ``nn.Linear`` (on CPU)."""
    xt = torch.as_tensor(x, dtype=torch.float64, device=device)
    yt = torch.as_tensor(y, dtype=torch.long, device=device)
    clf = nn.Linear(x.shape[1], num_classes).double().to(device)
    nn.init.zeros_(clf.weight)
    nn.init.zeros_(clf.bias)
    opt = torch.optim.LBFGS(clf.parameters(), lr=1.0, max_iter=max_iter, tolerance_grad=1e-9,
                            tolerance_change=1e-12, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(clf(xt), yt) + 0.5 * weight_decay * clf.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return clf.cpu()


def _fast(cfg: EvalConfig, encoder: Encoder, classes: list[str], train: Split,
          test: Split) -> tuple[dict[str, Any], dict[str, Any]]:
    # imported here: Lance is not fork-safe, and the full protocol (--full) forks DataLoader workers
    from moquad.eval.features import extract, read_features

    tr = read_features(extract(cfg, train.split, encoder=encoder))
    te = read_features(extract(cfg, test.split, encoder=encoder))
    keep_tr, keep_te = tr["label"] >= 0, te["label"] >= 0
    xtr, ytr = tr["embedding"][keep_tr].astype(np.float64), tr["label"][keep_tr]
    mean, std = xtr.mean(0), xtr.std(0) + 1e-6
    n_cls = max(len(classes), int(ytr.max()) + 1)
    clf = fit_logistic((xtr - mean) / std, ytr, n_cls, cfg.linear.l2, device=resolve_device(cfg.device))
    with torch.no_grad():
        logits = clf(torch.as_tensor((te["embedding"][keep_te] - mean) / std, dtype=torch.float64))
    probs = logits.softmax(1).numpy()
    proto = {"variant": "fast: logistic regression on cached features", "features": {k: v for k, v in tr["metadata"]["protocol"].items() if k != "split"},
             "standardise": "train mean/std", "solver": "L-BFGS float64, zero init", "l2": cfg.linear.l2,
             "backbone_check": "weights and BN buffers compared bit-for-bit after extraction"}
    return accuracy_report(probs, te["label"][keep_te], classes), proto


@torch.no_grad()
def predict_views(net: nn.Module, cfg: EvalConfig, split: Split, rows: np.ndarray | list[int], device: torch.device,
                  show: bool = True, norm: Callable[[torch.Tensor, Any], torch.Tensor] = normalize,
                  framing: Any = None) -> np.ndarray:
    """Softmax averaged over every test view of each video of ``rows`` -> (videos, classes); ``norm``: uint8 clips ->
    the network's input (an encoder's :meth:`Encoder.normalize`); ``framing``: its framing (None: the crop's)."""
    net.eval()
    views = TestViews(split, rows, cfg.frames, cfg.dilation, cfg.num_clips, cfg.size, cfg.crops, framing)
    loader = torch.utils.data.DataLoader(views, batch_size=None, num_workers=cfg.workers)
    out = []
    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task("testing", total=len(rows))
        for _, views in loader:
            p = [net(norm(views[s : s + cfg.batch_size], device)).float().softmax(1)
                 for s in range(0, len(views), cfg.batch_size)]
            out.append(torch.cat(p).mean(0).cpu().numpy())
            progress.advance(task)
    return np.stack(out)


def cosine(base: float, total: int) -> list[float]:
    """Half-period cosine from ``base`` to 0 without warm-up, ``base`` used as given (the paper's evaluation
    lrs are for their batch, not rescaled): the pre-training schedule at global batch 256."""
    return lr_schedule(base, 256, max(1, total), 0).tolist()


def _cvrl(cfg: EvalConfig, encoder: Encoder, classes: list[str], train: Split,
          test: Split) -> tuple[dict[str, Any], dict[str, Any]]:
    lc = cfg.linear
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    backbone = encoder.to(device).eval()
    before = snapshot(backbone)
    train_rows, test_rows = labelled(train), labelled(test)
    n_cls = max(len(classes), int(train.label.max()) + 1)
    clf = nn.Linear(backbone.out_dim, n_cls).to(device)
    opt = make_optimizer(clf, lc.optimizer, lc.lr, lc.weight_decay)
    ds = TrainClips(train, train_rows, cfg.frames, cfg.dilation, cfg.size, lc.flip, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=lc.batch_size, shuffle=True, generator=gen,
                                         num_workers=cfg.workers, drop_last=len(ds) > lc.batch_size)
    lrs = cosine(lc.lr, lc.epochs * len(loader))
    step = 0
    with Progress(transient=True) as progress:
        task = progress.add_task("linear probe", total=len(lrs))
        for epoch in range(lc.epochs):
            ds.epoch = epoch
            for clips, labels in loader:
                with torch.no_grad():
                    feats = backbone(backbone.normalize(clips, device)).float()
                for g in opt.param_groups:
                    g["lr"] = lrs[step]
                loss = nn.functional.cross_entropy(clf(feats), labels.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                progress.advance(task)
    probs = predict_views(nn.Sequential(backbone, clf), cfg, test, test_rows, device, norm=backbone.normalize,
                          framing=backbone.framing)
    check_unchanged(backbone, before)
    labels = test.label[test_rows]
    proto = {"variant": "cvrl: linear layer on the frozen backbone", "train_clip": f"{cfg.frames} frames, dilation {cfg.dilation}, "
             f"random start, short side size*8/7, random crop{' + flip' if lc.flip else ', no flip'}", "backbone": "eval mode, no grad",
             "test": f"{cfg.num_clips} clips x {cfg.crops} crops, softmax averaged", "epochs": lc.epochs,
             "batch_size": lc.batch_size, "optimizer": lc.optimizer, "lr": lc.lr, "schedule": "half-period cosine",
             "weight_decay": lc.weight_decay, "backbone_check": "weights and BN buffers compared bit-for-bit: unchanged"}
    return accuracy_report(probs, labels, classes), proto


def linear(cfg: EvalConfig, fast: bool = True, *, json_path: str | Path | None = None, quiet: bool = False,
           overwrite: bool = False, encoder: Encoder | None = None) -> dict[str, Any]:
    """Linear probe (``fast`` on cached features, else the CVRL protocol) trained on ``cfg.train_split``, tested on
    ``cfg.test_split``; returns the result (``result["json"]``: where it was written).

    Writes ``linear_fast.json`` (``linear_cvrl.json``) and its text table to the evaluation folder (``cfg.out``,
    else ``RUN/eval`` beside the checkpoint), and a copy of the JSON to ``json_path`` when given. A result
    already there (``moquad linear``'s, say) is an error unless ``overwrite``. ``quiet``: print no table.
    ``encoder``: the one the command resolved (default: the one ``cfg.checkpoint`` names)."""
    name = "linear_fast" if fast else "linear_cvrl"
    s = start(cfg, encoder, f"{name}.json", overwrite, "the linear probe")
    report, proto = (_fast if fast else _cvrl)(s.cfg, s.encoder, store.classes(s.cfg.data), s.train, s.test)
    result = provenance(s.cfg, s.train, s.test, s.encoder)
    result.update(task="linear", protocol=proto, **report)
    finish(result, s.cfg, s.encoder, s.path, lambda r: [*accuracy_tables(f"linear probe ({name})", report),
                                                         protocol_table("protocol", r)], json_path, quiet)
    return result
