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
- **Exact, at matmul speed**: float32 similarities and top-(k + 8) on the features' device, then
  float64 only where float32 cannot decide the rule (:func:`nearest`); ~1.1x a plain float32
  ``torch.topk`` (benchmarks/bench_retrieval.py).
- Beside hit@k: **weighted kNN classification**, DINO's protocol (:func:`knn_classify`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import torch
from rich.table import Table

from moquad.config import EvalConfig
from moquad.data.store import Split
from moquad.eval.common import out_dir, resolve_device
from moquad.eval.features import extract, read_features
from moquad.eval.report import protocol_table, provenance, write_result

TIE_DECIMALS = 9
FP32_U, FP64_U = 2.0**-24, 2.0**-53  # unit roundoff of float32 and float64 (round to nearest)
MARGIN = 8  # extra fp32 candidates beyond k, so a near-tie at the k-th place rarely needs a whole row


def prepare(x: np.ndarray, center: bool) -> np.ndarray:
    """float64 copy, optionally minus its own mean, then L2-normalised (zero vectors stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    if center:
        x = x - x.mean(0, keepdims=True)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def _as_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def fp32_error_bound(d: int, norms: float = 1.0) -> float:
    """Largest possible |fp32 similarity - float64 similarity| of two d-dim vectors whose norms multiply to ``norms``.

    Rounding the float64 inputs to float32 changes each product x_i*y_i by a factor (1+e1)(1+e2), |e| <= u
    (u = 2^-24); a float32 dot product of d terms, summed in ANY order (BLAS blocking, FMA, GPU split-K),
    is within gamma_d * sum|x_i y_i| of the exact dot of its inputs (Higham, Accuracy and Stability,
    Eq. 3.5); together gamma_{d+2} * sum|x_i y_i| with gamma_n = n u / (1 - n u), and
    sum|x_i y_i| <= |x| |y| (Cauchy-Schwarz). The float64 similarity the tie rule rounds is itself within
    gamma_d (u = 2^-53) of the exact value. Underflow is ignored (unit vectors of d < 10^6 dims).
    """
    g32 = (d + 2) * FP32_U / (1 - (d + 2) * FP32_U)
    g64 = d * FP64_U / (1 - d * FP64_U)
    return norms * (g32 + g64)


@contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Many small ops: on CPU one thread, so none waits at a barrier for a core another process holds
    (measured on a busy 2-core box: 2,662 float64 pair products took 96 ms on 2 threads, 4 ms on 1)."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _strict_fp32() -> Iterator[None]:
    """Full-precision float32 matmuls (no TF32 / bf16 passes), so the error bound above holds."""
    prec, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prec)
        torch.backends.cuda.matmul.allow_tf32 = tf32


def pair_similarities(q: torch.Tensor, g: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                      block: int = 1024) -> torch.Tensor:
    """float64 dot products q[rows[i]] . g[cols[i]] (the exact values the tie rule rounds), in blocks."""
    out = torch.empty(len(rows), dtype=torch.float64, device=q.device)
    for s in range(0, len(rows), block):
        r, c = rows[s : s + block], cols[s : s + block]
        out[s : s + block] = (q[r].double() * g[c].double()).sum(1)
    return out


def _exact_rows(q: torch.Tensor, g: torch.Tensor, k: int, block: int = 1 << 16) -> torch.Tensor:
    """The tie rule on whole rows, in float64 (the fallback of :func:`nearest`): (len(q), k) indices."""
    q64 = q.double()
    sim = torch.cat([q64 @ g[s : s + block].double().T for s in range(0, len(g), block)], dim=1)
    order = torch.sort(-torch.round(sim, decimals=TIE_DECIMALS), dim=1, stable=True).indices
    return order[:, :k]


def _max_norm(x: torch.Tensor) -> float:
    """An upper bound of the largest row norm of the vectors ``x`` (float32) rounds: its float32 norms raised
    by their worst relative error, (d + 4) u (rounding to float32, the sum of d squares, the square root)."""
    if len(x) == 0:
        return 0.0
    d = x.shape[1]
    return float(x.float().norm(dim=1).max()) * (1 + (d + 4) * FP32_U)


def _near_runs(v: torch.Tensor, cuts: list[int], tol: float) -> torch.Tensor:
    """Gaps (rows, places - 1) between sorted places j and j+1 that are <= ``tol`` AND belong to a run of
    such gaps spanning a cut (between places c and c+1, c in ``cuts``): where float32 cannot decide."""
    near = (v[:, :-1] - v[:, 1:]) <= tol
    run = torch.cumsum(~near, dim=1)  # the gaps of one run of near gaps share an id
    at_cut = torch.tensor([c - 1 for c in cuts if c - 1 < near.shape[1]], dtype=torch.long, device=v.device)
    hot = torch.zeros(near.shape[0], near.shape[1] + 1, dtype=torch.uint8, device=v.device)
    hot.scatter_reduce_(1, run[:, at_cut], near[:, at_cut].to(torch.uint8), reduce="amax")
    return near & hot.gather(1, run).bool()


def _fix_up(q: torch.Tensor, g: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, cuts: list[int], tol: float,
            complete: bool) -> torch.Tensor:
    """Exact top-k (k = max(cuts)) from fp32 candidates ``v, idx`` (sorted, k + margin + 1 per row): a run of
    near gaps spanning a cut is re-ranked by rounded float64 similarity, then gallery index; a run reaching
    the last candidate may go on outside them (unless ``complete``): that row is redone whole in float64."""
    k = max(cuts)
    with _one_cpu_thread(v.device):
        rel = _near_runs(v, cuts, tol)
        out = idx[:, :k].clone()  # rows without a near-tie at a cut: float32's order is the rule's
        whole = torch.zeros(len(v), dtype=torch.bool, device=v.device)
        if rel.shape[1] and not complete:
            whole = rel[:, -1]  # the run reaches the last candidate: the next, unseen, one may belong to it
        fix = (rel.any(1) & ~whole).nonzero().flatten()
        rel, v, idx = rel[fix], v[fix], idx[fix]
        need = torch.zeros_like(v, dtype=torch.bool)
        need[:, :-1] |= rel
        need[:, 1:] |= rel
        r, p = need.nonzero(as_tuple=True)
        key = v.double()
        key[r, p] = torch.round(pair_similarities(q, g, fix[r], idx[r, p]), decimals=TIE_DECIMALS)
        by_index, perm = idx.sort(dim=1)  # equal keys: lower gallery index first (stable sort below)
        order = torch.sort(-key.gather(1, perm), dim=1, stable=True).indices
        out[fix] = by_index.gather(1, order)[:, :k]
    if whole.any():
        out[whole] = _exact_rows(q[whole], g, k)
    return out


def nearest(q: np.ndarray | torch.Tensor, g: np.ndarray | torch.Tensor, k: int, chunk: int | None = None,
            cuts: Sequence[int] | None = None) -> np.ndarray:
    """Indices (Q, k) of the k most similar gallery rows (inputs already prepared), ties as documented.

    Exact at the cost of a float32 matmul: float32 similarities and top-(k + margin) on the device of
    ``q`` (a GPU when given CUDA tensors), then float64 only for the near-ties that can change the
    result (:func:`_fix_up`, bound :func:`fp32_error_bound`). ``cuts``: the prefix lengths whose SETS
    must be exact (hit@k for k in cuts; k itself always); default: every place, i.e. the whole order
    is the tie rule's. Between two cuts the order is float32's. Queries go in chunks (default: 64 M
    similarities, 256 MB, at a time; 1 GB on a GPU), so K400-size galleries fit.
    """
    qt = _as_tensor(q)
    gt = _as_tensor(g).to(qt.device)
    n, d = gt.shape
    k = min(k, n)
    if len(qt) == 0 or k == 0:
        return np.zeros((len(qt), k), dtype=np.int64)
    cuts = sorted({min(c, k) for c in (cuts or range(1, k + 1)) if c >= 1} | {k})
    top = min(n, k + MARGIN + 1)
    q32, g32 = qt.float(), gt.float()  # no copy when the features are float32 already
    tol = 2 * fp32_error_bound(d, _max_norm(q32) * _max_norm(g32)) + 2 * 10.0**-TIE_DECIMALS
    budget = 1 << (28 if qt.is_cuda else 26)  # similarities per block: 1 GB on a GPU, 256 MB on CPU
    chunk = chunk or max(1, min(4096, budget // n))
    out = []
    with torch.no_grad(), _strict_fp32():
        for s in range(0, len(qt), chunk):
            qc = qt[s : s + chunk]
            v, idx = torch.topk(q32[s : s + chunk] @ g32.T, top, dim=1)
            out.append(_fix_up(qc, gt, v, idx, cuts, tol, complete=top == n))
    return torch.cat(out).cpu().numpy()


def hits_at(nn: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """hit@k = share of queries with the query's class among their first min(k, gallery) neighbours."""
    same = g_labels[nn] == q_labels[:, None]
    return {f"hit@{k}": float(same[:, : min(k, nn.shape[1])].any(1).mean()) for k in ks}


def knn_classify(q: np.ndarray | torch.Tensor, g: np.ndarray | torch.Tensor, nn: np.ndarray,
                 q_labels: np.ndarray, g_labels: np.ndarray, k: int = 20, t: float = 0.07) -> dict[str, float]:
    """Weighted kNN classification, DINO's protocol (``eval_knn.knn_classifier``) -> knn_top1, knn_top5.

    Each query's k nearest gallery videos vote for their class with weight exp(cosine / t); classes
    rank by total vote; top-1 / top-5 = the query's class is the best / among the 5 best. As DINO:
    cosine on L2-normalised features, k=20, t=0.07 by default. Where this differs from DINO: the k
    neighbours are ``nn`` (the exact order and tie rule of :func:`nearest`; DINO: ``torch.topk``,
    ties unspecified); similarities are float64; equal class scores rank the lower label first
    (DINO: unspecified); a class with no vote never counts (DINO's top-5 can count a zero-score class
    when fewer than 5 classes are voted); weights are exp((s - max s) / t), the same ranking without
    overflow at small t; a gallery video of unknown label (-1) votes for an 'unknown' class, never right.
    """
    if k < 1 or t <= 0:
        raise ValueError(f"knn needs k >= 1 and temperature t > 0, got k={k}, t={t}")
    q_labels, g_labels = np.asarray(q_labels), np.asarray(g_labels)
    nb = nn[:, : min(k, nn.shape[1])]
    qt = _as_tensor(q)
    rows = np.repeat(np.arange(len(nb)), nb.shape[1])
    sim = pair_similarities(qt, _as_tensor(g).to(qt.device), torch.from_numpy(rows).to(qt.device),
                            torch.from_numpy(nb.ravel()).to(qt.device)).cpu().numpy().reshape(nb.shape)
    weight = np.exp((sim - sim.max(1, keepdims=True)) / t)
    unknown = int(max(g_labels.max(), q_labels.max())) + 1
    votes = np.zeros((len(nb), unknown + 1))
    np.add.at(votes, (rows, np.where(g_labels >= 0, g_labels, unknown)[nb].ravel()), weight.ravel())
    ranked = np.argsort(-votes, axis=1, kind="stable")[:, :5]  # stable: equal votes, lower label first
    right = (ranked == q_labels[:, None]) & (np.take_along_axis(votes, ranked, 1) > 0)
    return {"knn_top1": float(right[:, 0].mean()), "knn_top5": float(right.any(1).mean())}


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
    nn = nearest(prepare(q, center), prepare(g, center), max(ks), cuts=ks)
    return hits_at(nn, q_labels, g_labels, ks)


# Lance index used by ``--index lance``: the settings that won benchmarks/bench_retrieval.py (README).
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


def _check(cfg: EvalConfig) -> None:
    if not cfg.ks or min(cfg.ks) < 1:
        raise ValueError(f"ks must be positive integers, got {cfg.ks}")
    if cfg.index not in ("exact", "lance"):
        raise ValueError(f"index must be 'exact' or 'lance', got {cfg.index!r}")
    if cfg.knn_k < 1 or not cfg.knn_t > 0:
        raise ValueError(f"--knn-k must be >= 1 and --knn-t > 0, got {cfg.knn_k} and {cfg.knn_t}")


def _tables(cfg: EvalConfig, result: dict[str, Any], title: str) -> list[Table]:
    """hit@k per k (exact, and the Lance index when used); the weighted-kNN accuracy; the protocol."""
    table = Table(title=title, min_width=len(title) + 4)
    table.add_column("k", justify="right")
    table.add_column("hit@k exact (%)", justify="right")
    if cfg.index == "lance":
        table.add_column("hit@k lance (%)", justify="right")
        table.add_column("recall@k vs exact", justify="right")
    for k in cfg.ks:
        row = [str(k), f"{100 * result['exact'][f'hit@{k}']:.2f}"]
        if cfg.index == "lance":
            row += [f"{100 * result['lance'][f'hit@{k}']:.2f}", f"{result['lance'][f'recall@{k}']:.3f}"]
        table.add_row(*row)
    knn = result["knn"]
    kt_title = "weighted kNN classification (DINO protocol)"
    kt = Table(title=kt_title, min_width=len(kt_title) + 4)
    for col in ("k", "T", "top-1 (%)", "top-5 (%)"):
        kt.add_column(col, justify="right")
    kt.add_row(str(knn["k"]), f"{knn['t']:g}", f"{100 * knn['knn_top1']:.2f}", f"{100 * knn['knn_top5']:.2f}")
    return [table, kt, protocol_table("protocol", result)]


def retrieve(cfg: EvalConfig, json_path: str | Path | None = None, *, query_split: str = "test",
             gallery_split: str = "train") -> dict[str, Any]:
    """Run the retrieval protocol and weighted kNN (extracting features first when not cached); write JSON + tables."""
    _check(cfg)
    q_path, g_path = extract(cfg, query_split), extract(cfg, gallery_split)
    qf, gf = read_features(q_path), read_features(g_path)
    keep = qf["label"] >= 0
    q, ql = prepare(qf["embedding"][keep], cfg.center), qf["label"][keep]
    g, gl = prepare(gf["embedding"], cfg.center), gf["label"]
    if len(q) == 0:
        raise ValueError(f"no labelled videos in split {query_split!r}; retrieval needs class labels")
    device = resolve_device(cfg.device)  # a GPU when there is one: the matmul runs where the features are
    qt, gt = torch.from_numpy(q).to(device), torch.from_numpy(g).to(device)
    exact = nearest(qt, gt, max(*cfg.ks, cfg.knn_k), cuts=[*cfg.ks, cfg.knn_k])  # exact sets at each k
    result: dict[str, Any] = provenance(cfg, {query_split: Split(cfg.data, query_split),
                                              gallery_split: Split(cfg.data, gallery_split)})
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
    result["knn"] = {"k": min(cfg.knn_k, len(g)), "t": cfg.knn_t, **knn}
    result.update(knn)  # knn_top1, knn_top5 headline numbers
    if cfg.index == "lance":
        approx = lance_nearest(g, q, max(cfg.ks), out_dir(cfg) / "features" / f"{gallery_split}-index.lance")
        # a missing neighbour (-1) indexes the appended sentinel label -2, which never matches a query
        result["lance"] = {**hits_at(approx, ql, np.append(gl, -2), cfg.ks), **recall_at(approx, exact, cfg.ks)}
    title = (f"retrieval: {len(q)} {query_split} queries vs {len(g)} {gallery_split} videos"
             f"{' (centred)' if cfg.center else ''}")
    if json_path is None:
        json_path = out_dir(cfg) / f"retrieval{'_center' if cfg.center else ''}.json"
    write_result(result, json_path, _tables(cfg, result, title))
    result["json"] = str(json_path)
    return result
