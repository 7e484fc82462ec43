"""Exact nearest-neighbour search by cosine similarity, with a documented tie rule.

- **Ties**: similarities are compared at a resolution of 1e-9 (so two identical gallery
  videos tie exactly whatever the BLAS summation order), and equal similarities are ordered
  by gallery position (train manifest order), lower first. The k nearest are the first k
  in that order, i.e. a tie at the k-th place is NOT counted in the query's favour.
- **Exact, at matmul speed**: float32 similarities and top-(k + 8) on the features' device, then
  float64 only where float32 cannot decide the rule (:func:`nearest`); ~1.1x a plain float32
  ``torch.topk`` (benchmarks/bench_retrieval.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

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


def as_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
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
    """Indices (Q, k) of the k most similar gallery rows (inputs from ``moquad.prepare_features``).

    Ties: similarities are compared at a resolution of 1e-9, and equal ones are ordered by gallery position,
    lower first (a tie at the k-th place does not count in the query's favour). Exact at the cost of a float32
    matmul: float32 similarities and top-(k + margin) on the device of ``q`` (a GPU when given CUDA tensors),
    then float64 only for the near-ties that can change the result. ``cuts``: the prefix lengths whose SETS
    must be exact (hit@k for k in cuts; k itself always); default: every place, i.e. the whole order
    is the tie rule's. Between two cuts the order is float32's. Queries go in chunks (default: 64 M
    similarities, 256 MB, at a time; 1 GB on a GPU), so K400-size galleries fit.
    """
    qt = as_tensor(q)
    gt = as_tensor(g).to(qt.device)
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
