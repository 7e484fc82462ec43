"""Nearest-neighbour video retrieval (UCF101/HMDB51 protocol of Pace, RSPNet, CoCLR).

Every test video queries the train split; similarity is cosine between video features;
a query scores a hit at k when ANY of its k nearest train videos has its class.

Protocol choices, explicit:

- **Centring** (``center=True``, as CoCLR / FAME): each split is centred with ITS OWN mean
  (queries minus the test-split mean, gallery minus the train-split mean), then every vector
  is L2-normalised. Without centring the vectors are only L2-normalised.
- **Ties**: similarities are compared at a resolution of 1e-9 (so two identical gallery
  videos tie exactly whatever the BLAS summation order), and equal similarities are ordered
  by gallery position (train manifest order), lower first. The k nearest are the first k
  in that order, i.e. a tie at the k-th place is NOT counted in the query's favour.
- k larger than the gallery is capped at the gallery size (reported as ``k_capped``).
- Queries with an unknown label (-1) are excluded and counted (``excluded_queries``).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from rich.table import Table

from moquad.config import EvalConfig
from moquad.data.store import Split
from moquad.eval.common import out_dir
from moquad.eval.features import extract, read_features
from moquad.eval.report import protocol_table, provenance, write_result

TIE_DECIMALS = 9


def prepare(x: np.ndarray, center: bool) -> np.ndarray:
    """float64 copy, optionally minus its own mean, then L2-normalised (zero vectors stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    if center:
        x = x - x.mean(0, keepdims=True)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def nearest(q: np.ndarray, g: np.ndarray, k: int, chunk: int | None = None) -> np.ndarray:
    """Indices (Q, k) of the k most similar gallery rows (inputs already prepared), ties as documented.

    Queries go in chunks (default: ~64 M similarities, 512 MB, at a time), so K400-size galleries fit.
    """
    k = min(k, len(g))
    chunk = chunk or max(1, min(4096, (1 << 26) // max(1, len(g))))
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), chunk):
        sim = np.round(q[s : s + chunk] @ g.T, TIE_DECIMALS)
        kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1]  # the k-th largest value per row
        for r, row in enumerate(sim):
            cand = np.flatnonzero(row >= kth[r])  # every row reaching the k-th value, in gallery order
            out[s + r] = cand[np.argsort(-row[cand], kind="stable")][:k]
    return out


def hits_at(nn: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """hit@k = share of queries with the query's class among their first min(k, gallery) neighbours."""
    same = g_labels[nn] == q_labels[:, None]
    return {f"hit@{k}": float(same[:, : min(k, nn.shape[1])].any(1).mean()) for k in ks}


def topk_retrieval(
    q: np.ndarray,
    q_labels: np.ndarray,
    g: np.ndarray,
    g_labels: np.ndarray,
    ks: Sequence[int] = (1, 5, 10, 20, 50),
    center: bool = False,
) -> dict[str, float]:
    """Top-k retrieval accuracy of queries ``q`` against gallery ``g`` -> {"hit@k": fraction}."""
    q_labels, g_labels = np.asarray(q_labels), np.asarray(g_labels)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    if len(q) != len(q_labels) or len(g) != len(g_labels):
        raise ValueError("features and labels must have the same number of rows")
    if len(q) == 0 or len(g) == 0:
        raise ValueError("retrieval needs at least one query and one gallery video")
    nn = nearest(prepare(q, center), prepare(g, center), max(ks))
    return hits_at(nn, q_labels, g_labels, ks)


def lance_nearest(gallery: np.ndarray, queries: np.ndarray, k: int, path: Path, nprobes: int | None = None) -> np.ndarray:
    """Approximate k nearest through a Lance IVF_PQ cosine index over the (prepared) gallery."""
    n, d = gallery.shape
    k = min(k, n)
    table = pa.table({"row": pa.array(np.arange(n)),
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(gallery.astype(np.float32).ravel()), d)})
    shutil.rmtree(path, ignore_errors=True)
    ds = lance.write_dataset(table, str(path), mode="create")
    parts = max(1, min(256, int(np.sqrt(n))))
    sub = next(s for s in (16, 8, 4, 2, 1) if d % s == 0)
    ds.create_index("embedding", index_type="IVF_PQ", metric="cosine", num_partitions=parts, num_sub_vectors=sub)
    nprobes = nprobes or max(1, parts // 4)
    out = np.empty((len(queries), k), dtype=np.int64)
    for i, v in enumerate(queries.astype(np.float32)):
        r = ds.to_table(nearest={"column": "embedding", "q": v, "k": k, "metric": "cosine", "nprobes": nprobes,
                                 "refine_factor": 4}, columns=["row"])
        rows = r.column("row").to_numpy()
        out[i, : len(rows)] = rows
        out[i, len(rows) :] = -1
    return out


def recall_at(approx: np.ndarray, exact: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """recall@k of the index = mean |approx top-k ∩ exact top-k| / k (k capped at the gallery)."""
    res = {}
    for k in ks:
        kk = min(k, exact.shape[1])
        res[f"recall@{k}"] = float(np.mean([len(set(a[:kk]) & set(e[:kk])) / kk for a, e in zip(approx, exact)]))
    return res


def retrieve(cfg: EvalConfig, json_path: str | Path | None = None, *, query_split: str = "test",
             gallery_split: str = "train") -> dict[str, Any]:
    """Run the retrieval protocol (extracting features first when not cached); write JSON + table."""
    if not cfg.ks or min(cfg.ks) < 1:
        raise ValueError(f"ks must be positive integers, got {cfg.ks}")
    if cfg.index not in ("exact", "lance"):
        raise ValueError(f"index must be 'exact' or 'lance', got {cfg.index!r}")
    q_path, g_path = extract(cfg, query_split), extract(cfg, gallery_split)
    qf, gf = read_features(q_path), read_features(g_path)
    keep = qf["label"] >= 0
    q, ql = prepare(qf["embedding"][keep], cfg.center), qf["label"][keep]
    g, gl = prepare(gf["embedding"], cfg.center), gf["label"]
    if len(q) == 0:
        raise ValueError(f"no labelled videos in split {query_split!r}; retrieval needs class labels")
    kmax = max(cfg.ks)
    exact = nearest(q, g, kmax)
    result: dict[str, Any] = provenance(cfg, {query_split: Split(cfg.data, query_split),
                                              gallery_split: Split(cfg.data, gallery_split)})
    result["task"] = "retrieval"
    result["protocol"] = {
        "queries": query_split, "gallery": gallery_split, "similarity": "cosine",
        "center": "each split minus its own mean, then L2" if cfg.center else "none (L2 only)",
        "hit": "any of the k nearest has the query's class",
        "ties": f"similarity rounded to 1e-{TIE_DECIMALS}, equal ones ordered by gallery position",
        "ks": list(cfg.ks), "index": cfg.index,
        "features": {k: v for k, v in qf["metadata"]["protocol"].items() if k != "split"},
    }
    result["features"] = {query_split: str(q_path), gallery_split: str(g_path)}
    result["queries"], result["gallery"] = int(len(q)), int(len(g))
    result["excluded_queries"] = int((~keep).sum())
    result["k_capped"] = [k for k in cfg.ks if k > len(g)]
    result["exact"] = hits_at(exact, ql, gl, cfg.ks)
    result.update({f"top{k}": result["exact"][f"hit@{k}"] for k in cfg.ks})  # headline numbers (exact search)
    title = (f"retrieval: {len(q)} {query_split} queries vs {len(g)} {gallery_split} videos"
             f"{' (centred)' if cfg.center else ''}")
    table = Table(title=title, min_width=len(title) + 4)
    table.add_column("k", justify="right")
    table.add_column("hit@k exact (%)", justify="right")
    if cfg.index == "lance":
        approx = lance_nearest(g, q, kmax, out_dir(cfg) / "features" / f"{gallery_split}-index.lance")
        # a missing neighbour (-1) indexes the appended sentinel label -2, which never matches a query
        lance_hits = hits_at(approx, ql, np.append(gl, -2), cfg.ks)
        result["lance"] = {**lance_hits, **recall_at(approx, exact, cfg.ks)}
        table.add_column("hit@k lance (%)", justify="right")
        table.add_column("recall@k vs exact", justify="right")
    for k in cfg.ks:
        row = [str(k), f"{100 * result['exact'][f'hit@{k}']:.2f}"]
        if cfg.index == "lance":
            row += [f"{100 * result['lance'][f'hit@{k}']:.2f}", f"{result['lance'][f'recall@{k}']:.3f}"]
        table.add_row(*row)
    if json_path is None:
        json_path = out_dir(cfg) / f"retrieval{'_center' if cfg.center else ''}.json"
    write_result(result, json_path, [table, protocol_table("protocol", result)])
    result["json"] = str(json_path)
    return result
