"""Nearest-neighbour video retrieval (UCF101/HMDB51 protocol of Pace, RSPNet, CoCLR).

Every video of ``cfg.test_split`` queries ``cfg.train_split`` (the gallery); similarity is cosine between video
features; a query scores a hit at k when ANY of its k nearest gallery videos has its class.

Protocol choices, explicit:

- **Centring** (``center=True``, as CoCLR / FAME): each split is centred with ITS OWN mean
  (queries minus the test-split mean, gallery minus the train-split mean), then every vector
  is L2-normalised. Without centring the vectors are only L2-normalised.
- **Ties** and exact search: :mod:`moquad.eval.search`; ``--index lance``: :mod:`moquad.eval.ann`.
- k larger than the gallery is capped at the gallery size (reported as ``k_capped``).
- Queries with an unknown label (-1) are excluded and counted (``excluded_queries``).
- Beside hit@k: **weighted kNN classification**, DINO's protocol (:func:`knn_classify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table

from moquad.config import EvalConfig
from moquad.eval.ann import lance_nearest, recall_at
from moquad.eval.common import (
    out_dir,
    resolve_device,
    start,
)
from moquad.eval.encoders import Encoder
from moquad.eval.features import extract, read_features
from moquad.eval.report import finish, protocol_table, provenance
from moquad.eval.search import TIE_DECIMALS, as_tensor, nearest, pair_similarities, prepare


def hits_at(nn: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """hit@k = share of queries with the query's class among their first min(k, gallery) neighbours."""
    same = g_labels[nn] == q_labels[:, None]
    return {f"hit@{k}": float(same[:, : min(k, nn.shape[1])].any(1).mean()) for k in ks}


def knn_classify(q: np.ndarray | torch.Tensor, g: np.ndarray | torch.Tensor, nn: np.ndarray,
                 q_labels: np.ndarray, g_labels: np.ndarray, k: int, t: float) -> dict[str, Any]:
    """Weighted kNN classification, DINO's protocol (``eval_knn.knn_classifier``) -> knn_top1, knn_top5 and
    ``per_class_top1`` (label -> top-1 over that class's queries: which classes the features tell apart).

    Each query's k nearest gallery videos vote for their class with weight exp(cosine / t); classes
    rank by total vote; top-1 / top-5 = the query's class is the best / among the 5 best. As DINO:
    cosine on L2-normalised features (k, t: ``EvalConfig.knn_k`` / ``knn_t``, DINO's 20 and 0.07). Where this differs from DINO: the k
    neighbours are ``nn`` (the exact order and tie rule of ``moquad.nearest``; DINO: ``torch.topk``,
    ties unspecified); similarities are float64; equal class scores rank the lower label first
    (DINO: unspecified); a class with no vote never counts (DINO's top-5 can count a zero-score class
    when fewer than 5 classes are voted); weights are exp((s - max s) / t), the same ranking without
    overflow at small t; a gallery video of unknown label (-1) votes for an 'unknown' class, never right.
    """
    q_labels, g_labels = np.asarray(q_labels), np.asarray(g_labels)
    nb = nn[:, : min(k, nn.shape[1])]
    qt = as_tensor(q)
    rows = np.repeat(np.arange(len(nb)), nb.shape[1])
    sim = pair_similarities(qt, as_tensor(g).to(qt.device), torch.from_numpy(rows).to(qt.device),
                            torch.from_numpy(nb.ravel()).to(qt.device)).cpu().numpy().reshape(nb.shape)
    weight = np.exp((sim - sim.max(1, keepdims=True)) / t)
    unknown = int(max(g_labels.max(), q_labels.max())) + 1
    votes = np.zeros((len(nb), unknown + 1))
    np.add.at(votes, (rows, np.where(g_labels >= 0, g_labels, unknown)[nb].ravel()), weight.ravel())
    ranked = np.argsort(-votes, axis=1, kind="stable")[:, :5]  # stable: equal votes, lower label first
    right = (ranked == q_labels[:, None]) & (np.take_along_axis(votes, ranked, 1) > 0)
    per_class = {int(c): float(right[q_labels == c, 0].mean()) for c in np.unique(q_labels)}
    return {"knn_top1": float(right[:, 0].mean()), "knn_top5": float(right.any(1).mean()), "per_class_top1": per_class}


def _tables(cfg: EvalConfig, result: dict[str, Any], title: str) -> list[Table]:
    """hit@k per k (exact, and the Lance index when used); the weighted-kNN accuracy; the protocol."""
    table = Table(title=title, min_width=len(title) + 4)
    table.add_column("k", justify="right")
    table.add_column("hit@k exact (%)", justify="right")
    if cfg.index == "lance":
        table.add_column("hit@k lance (%)", justify="right")
        table.add_column("recall@k vs exact", justify="right")
    gallery = result["gallery"]
    for k in cfg.ks:
        row = [f"{k} *" if k >= gallery else str(k), f"{100 * result['exact'][f'hit@{k}']:.2f}"]
        if cfg.index == "lance":
            row += [f"{100 * result['lance'][f'hit@{k}']:.2f}", f"{result['lance'][f'recall@{k}']:.3f}"]
        table.add_row(*row)
    if any(k >= gallery for k in cfg.ks):  # every gallery video is among the k nearest: not a measure of the encoder
        table.caption = f"* capped: k >= the {gallery}-video gallery, 100 % by construction"
        table.caption_justify, table.min_width = "left", max(table.min_width or 0, len(table.caption))
    knn = result["knn"]
    kt_title = "weighted kNN classification (DINO protocol)"
    kt = Table(title=kt_title, min_width=len(kt_title) + 4)
    for col in ("k", "T", "top-1 (%)", "top-5 (%)"):
        kt.add_column(col, justify="right")
    kt.add_row(str(knn["k"]), f"{knn['t']:g}", f"{100 * knn['knn_top1']:.2f}", f"{100 * knn['knn_top5']:.2f}")
    return [table, kt, protocol_table("protocol", result)]


def retrieve(cfg: EvalConfig, json_path: str | Path | None = None, *, quiet: bool = False,
             overwrite: bool = False, encoder: Encoder | None = None) -> dict[str, Any]:
    """Run the retrieval protocol and weighted kNN, ``cfg.test_split`` querying ``cfg.train_split`` (extracting
    features first when not cached) and return the result (``result["json"]``: where it was written).

    Writes ``retrieval.json`` (``retrieval_center.json`` with ``cfg.center``) and its text table to the
    evaluation folder (``cfg.out``, else ``RUN/eval`` beside the checkpoint), and a copy of the JSON to
    ``json_path`` when given. A result already there (``moquad retrieve``'s, say) is an error unless
    ``overwrite``. ``quiet``: print no table. ``encoder``: the one the command resolved (default: the one
    ``cfg.checkpoint`` names)."""
    s = start(cfg, encoder, f"retrieval{'_center' if cfg.center else ''}.json", overwrite, "retrieval")
    cfg, encoder, gallery, queries = s.cfg, s.encoder, s.train, s.test
    query_split, gallery_split = queries.split, gallery.split
    q_path, g_path = extract(cfg, query_split, encoder=encoder), extract(cfg, gallery_split, encoder=encoder)
    qf, gf = read_features(q_path), read_features(g_path)
    keep = qf["label"] >= 0
    q, ql = prepare(qf["embedding"][keep], cfg.center), qf["label"][keep]
    g, gl = prepare(gf["embedding"], cfg.center), gf["label"]
    device = resolve_device(cfg.device)  # a GPU when there is one: the matmul runs where the features are
    qt, gt = torch.from_numpy(q).to(device), torch.from_numpy(g).to(device)
    exact = nearest(qt, gt, max(*cfg.ks, cfg.knn_k), cuts=[*cfg.ks, cfg.knn_k])  # exact sets at each k
    result: dict[str, Any] = provenance(cfg, gallery, queries, encoder)
    result["task"] = "retrieval"
    result["protocol"] = {
        "queries": query_split, "gallery": gallery_split, "similarity": "cosine",
        "center": "each split minus its own mean, then L2" if cfg.center else "none (L2 only)",
        "hit": "any of the k nearest has the query's class",
        "ties": f"similarity rounded to 1e-{TIE_DECIMALS}, equal ones ordered by gallery position",
        "ks": list(cfg.ks), "index": cfg.index,
        "knn": f"DINO weighted kNN: the {cfg.knn_k} nearest (at most the gallery) vote exp(cos/{cfg.knn_t:g}) "
               "for their class",
        "features": {k: v for k, v in qf["metadata"]["protocol"].items() if k != "split"},
    }
    result["features"] = {query_split: str(q_path), gallery_split: str(g_path)}
    result["queries"], result["gallery"] = int(len(q)), int(len(g))
    result["excluded_queries"] = int((~keep).sum())
    result["k_capped"] = [k for k in cfg.ks if k > len(g)]
    result["exact"] = hits_at(exact, ql, gl, cfg.ks)
    result.update({f"top{k}": result["exact"][f"hit@{k}"] for k in cfg.ks})  # headline numbers (exact search)
    knn = knn_classify(qt, gt, exact, ql, gl, cfg.knn_k, cfg.knn_t)
    names = dict(zip(ql.tolist(), np.asarray(qf["class_name"], dtype=object)[keep].tolist()))
    per_class = {names[c]: v for c, v in knn.pop("per_class_top1").items()}
    result["knn"] = {"k": min(cfg.knn_k, len(g)), "t": cfg.knn_t, **knn, "per_class_top1": per_class}
    result.update(knn)  # knn_top1, knn_top5 headline numbers
    if cfg.index == "lance":
        approx = lance_nearest(g, q, max(cfg.ks), out_dir(cfg) / "features" / f"{gallery_split}-index.lance")
        # a missing neighbour (-1) indexes the appended sentinel label -2, which never matches a query
        result["lance"] = {**hits_at(approx, ql, np.append(gl, -2), cfg.ks), **recall_at(approx, exact, cfg.ks)}
    title = (f"retrieval: {len(q)} {query_split} queries vs {len(g)} {gallery_split} videos"
             f"{' (centred)' if cfg.center else ''}")
    finish(result, cfg, encoder, s.path, lambda r: _tables(cfg, r, title), json_path, quiet)
    return result
