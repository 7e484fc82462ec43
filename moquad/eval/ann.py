"""Approximate nearest neighbours through a Lance vector index (``--index lance``, for big galleries).

The settings are those that won benchmarks/bench_retrieval.py (README); the protocol reports the
index's hit@k beside the exact one and its recall@k against exact search.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

LANCE_INDEX = "IVF_FLAT"
LANCE_NPROBES = 0.03  # share of the IVF partitions searched per query


def lance_partitions(n: int) -> int:
    """IVF partitions for a gallery of n vectors: ~sqrt(n), so a partition holds ~sqrt(n) vectors."""
    return max(1, min(4096, round(np.sqrt(n))))


def lance_index(gallery: np.ndarray, path: Path, index_type: str = LANCE_INDEX, partitions: int | None = None,
                **build: Any) -> lance.LanceDataset:
    """Write the (prepared) gallery as a Lance dataset at ``path`` with a cosine vector index on it."""
    n, d = gallery.shape
    table = pa.table({"row": pa.array(np.arange(n)),
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(
                          gallery, dtype=np.float32).ravel()), d)})
    shutil.rmtree(path, ignore_errors=True)
    ds = lance.write_dataset(table, str(path), mode="create")
    ds.create_index("embedding", index_type=index_type, metric="cosine",
                    num_partitions=partitions or lance_partitions(n), **build)
    return ds


def _lance_query(ds: lance.LanceDataset, queries: np.ndarray, k: int, search: dict[str, Any]) -> np.ndarray:
    res = ds.to_table(nearest={"column": "embedding", "q": np.ascontiguousarray(queries, dtype=np.float32), "k": k,
                               "metric": "cosine", **search}, columns=["row"], disable_scoring_autoprojection=True)
    qi, rows = res.column("query_index").to_numpy(), res.column("row").to_numpy()
    out = np.full((len(queries), k), -1, dtype=np.int64)
    order = np.argsort(qi, kind="stable")  # per query, in Lance's (distance) order
    qi, rows = qi[order], rows[order]
    out[qi, np.arange(len(qi)) - np.searchsorted(qi, qi)] = rows
    return out


def lance_search(ds: lance.LanceDataset, queries: np.ndarray, k: int, nprobes: int, **search: Any) -> np.ndarray:
    """(Q, k) gallery rows from ONE batched Lance query searching ``nprobes`` IVF partitions; queries whose
    partitions held fewer than k vectors are asked again, searching on until k are found."""
    out = _lance_query(ds, queries, k, {"nprobes": nprobes, **search})
    short = (out < 0).any(1)
    if short.any():
        out[short] = _lance_query(ds, queries[short], k, {"minimum_nprobes": nprobes, **search})
    return out


def lance_trained_partitions(ds: lance.LanceDataset) -> int:
    """IVF partitions the index really has (Lance may train fewer than asked on a small gallery)."""
    return int(ds.stats.index_stats("embedding_idx")["indices"][0]["num_partitions"])


def lance_nearest(gallery: np.ndarray, queries: np.ndarray, k: int, path: Path) -> np.ndarray:
    """Approximate k nearest through a Lance vector index (``LANCE_INDEX``, ``LANCE_NPROBES``)."""
    ds = lance_index(gallery, path)
    nprobes = max(1, round(LANCE_NPROBES * lance_trained_partitions(ds)))
    return lance_search(ds, queries, min(k, len(gallery)), nprobes)


def recall_at(approx: np.ndarray, exact: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """recall@k of the index = mean |approx top-k ∩ exact top-k| / k (k capped at the gallery)."""
    res = {}
    for k in ks:
        kk = min(k, exact.shape[1])
        res[f"recall@{k}"] = float(np.mean([len(set(a[:kk]) & set(e[:kk])) / kk for a, e in zip(approx, exact)]))
    return res
