"""Retrieval at scale: moquad's exact search vs a plain float32 matmul + topk vs Lance vector indexes.

Part 1 (``--part exact``), the UCF101 problem (3,783 test queries x 9,537 train videos x 512-d,
top-50, float64 prepared features as ``moquad retrieve`` passes them): moquad ``nearest`` (exact,
the documented tie rule) against ``torch.topk(q @ g.T)`` on float32 -- the goal is <= 1.2x -- and the
previous float64 implementation (a per-row Python loop, kept here as the "before" baseline).

Part 2 (``--part gallery``), galleries of ``--sizes`` random and clustered 512-d unit vectors
(clustered: ``--clusters`` Gaussian centres, noise as large as the centre) and ``--queries`` queries
from the same distribution, top-10: exact (moquad), plain topk, and Lance indexes (IVF_FLAT,
IVF_PQ + refine_factor, IVF_SQ + refine, IVF_HNSW_SQ) at several probe settings, all queries in ONE
batched Lance call. Reported: recall@10 against exact, build time (write + index), query time, and
the speed-up over exact. Times are medians of ``--repeats`` runs, taken in this process.

Run: ``nice python benchmarks/bench_retrieval.py --sizes 10000,100000,1000000 --repeats 3``
(1M: ~2 GB of vectors plus ~2 GB on disk under ``--tmp``; peak memory ~6 GB). The tables go to
``docs/results/bench_retrieval.json`` (``--record``), which the retrieval page renders.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from moquad.eval.ann import (
    lance_index,
    lance_partitions,
    lance_search,
    lance_trained_partitions,
    recall_at,
)
from moquad.eval.search import TIE_DECIMALS, nearest
from moquad.record import Record, add_argument

CHUNK = 1 << 26  # similarities per matmul block, as moquad's nearest (256 MB of float32)


def _median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def plain_topk(q: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    """The floor: float32 matmul + torch.topk, query blocks of CHUNK similarities, no tie rule."""
    q, g = q.float(), g.float()
    step = max(1, CHUNK // len(g))
    return torch.cat([torch.topk(q[s : s + step] @ g.T, k, dim=1).indices for s in range(0, len(q), step)])


def old_float64_nearest(q: np.ndarray, g: np.ndarray, k: int) -> np.ndarray:
    """moquad's earlier exact search (float64 matmul, a Python loop per row), the 'before' row."""
    k = min(k, len(g))
    chunk = max(1, min(4096, CHUNK // max(1, len(g))))
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), chunk):
        sim = np.round(q[s : s + chunk] @ g.T, TIE_DECIMALS)
        kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1]
        for r, row in enumerate(sim):
            cand = np.flatnonzero(row >= kth[r])
            out[s + r] = cand[np.argsort(-row[cand], kind="stable")][:k]
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x, dim=1)


def make_vectors(kind: str, n: int, d: int, clusters: int, seed: int) -> torch.Tensor:
    """n unit vectors: 'random' (isotropic Gaussian) or 'clustered' (centre + same-size noise), float32."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, d, generator=torch.Generator().manual_seed(12345))
    out = torch.empty(n, d)
    for s in range(0, n, 1 << 16):
        m = min(1 << 16, n - s)
        x = torch.randn(m, d, generator=gen)
        if kind == "clustered":
            x += centres[torch.randint(0, clusters, (m,), generator=gen)]
        out[s : s + m] = _unit(x)
    return out


def part_exact(rec: Record, repeats: int, device: str) -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(3783, 512))
    g = rng.normal(size=(9537, 512))
    q, g = q / np.linalg.norm(q, axis=1, keepdims=True), g / np.linalg.norm(g, axis=1, keepdims=True)
    qt, gt = torch.from_numpy(q).to(device), torch.from_numpy(g).to(device)
    q32, g32 = qt.float(), gt.float()
    ks = (1, 5, 10, 20, 50)
    runs = {"plain": partial(plain_topk, q32, g32, 50), "cuts": partial(nearest, qt, gt, 50, cuts=ks),
            "all": partial(nearest, qt, gt, 50)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved, so a busy neighbour slows all alike
        for name, fn in runs.items():
            times[name].append(_median_time(fn, 1)[0])
    t = {name: statistics.median(v) for name, v in times.items()}
    t["old"], old = _median_time(partial(old_float64_nearest, q, g, 50), 1)
    assert np.array_equal(nearest(qt, gt, 50), old), "exact search disagrees with the float64 rule"
    rec.figures["exact s"] = t
    rec.table("exact", ["method", "time (s)", "vs plain topk"],
              [[label, f"{t[name]:.3f}", f"{t[name] / t['plain']:.2f}x"]
               for name, label in (("plain", "plain fp32 matmul + `torch.topk` (no tie rule)"),
                                   ("cuts", "moquad `nearest`, exact sets at k = 1, 5, 10, 20, 50 (`retrieve`)"),
                                   ("all", "moquad `nearest`, exact order at every place"),
                                   ("old", "float64 matmul + a loop per row (1 run)"))],
              title=f"UCF101 size: 3,783 x 9,537 x 512, top-50, {device}, torch threads {torch.get_num_threads()}, "
                    f"median of {repeats}")


# (index, build kwargs, [search kwargs ...], largest gallery it is built for); nprobes = share of the
# partitions. HNSW graphs take minutes per 100k vectors on 2 cores: not built for 1M here.
LANCE = (
    ("IVF_FLAT", {}, [{"nprobes": f} for f in (0.003, 0.01, 0.03, 0.1)], 10**7),
    ("IVF_SQ", {}, [{"nprobes": f, "refine_factor": 5} for f in (0.01, 0.03)], 10**7),
    ("IVF_PQ", {"num_sub_vectors": 64}, [{"nprobes": f, "refine_factor": 10} for f in (0.01, 0.03)], 10**7),
    ("IVF_HNSW_SQ", {"num_partitions": 0}, [{"nprobes": 1.0, "ef": e, "refine_factor": 5} for e in (100, 400)],
     100_000),
)


def _lance_rows(name: str, build: dict, searches: list[dict], g: torch.Tensor, q: np.ndarray, exact: np.ndarray,
                t_exact: float, repeats: int, tmp: Path) -> list[tuple]:
    parts = build.pop("num_partitions", None)
    parts = max(1, len(g) // 50_000) if parts == 0 else lance_partitions(len(g))  # HNSW: big partitions
    t0 = time.perf_counter()
    ds = lance_index(g.numpy(), tmp / f"{name}.lance", index_type=name, partitions=parts, **build)
    t_build = time.perf_counter() - t0
    parts = lance_trained_partitions(ds)
    rows, seen = [], set()
    for s in searches:
        nprobes = max(1, round(s["nprobes"] * parts))
        extra = {k: v for k, v in s.items() if k != "nprobes"}
        if (nprobes, *extra.items()) in seen:  # small galleries: two shares round to the same probe count
            continue
        seen.add((nprobes, *extra.items()))
        t, approx = _median_time(partial(lance_search, ds, q, 10, nprobes, **extra), repeats)
        label = f"{name} p={parts} nprobes={nprobes}" + "".join(f" {k}={v}" for k, v in extra.items())
        rows.append((label, recall_at(approx, exact, (10,))["recall@10"], t_build, t, t_exact / t))
    shutil.rmtree(tmp / f"{name}.lance", ignore_errors=True)
    return rows


def part_gallery(rec: Record, sizes: list[int], kinds: list[str], n_queries: int, clusters: int, repeats: int,
                 tmp: Path, indexes: list[str]) -> None:
    print(f"{'gallery':<20}{'method':<52}{'recall@10':>10}{'build (s)':>11}{'query (s)':>11}{'vs exact':>10}")
    table: list[list] = []
    for n in sizes:
        for kind in kinds:
            g = make_vectors(kind, n, 512, clusters, seed=1)
            q = make_vectors(kind, n_queries, 512, clusters, seed=2)
            t_exact, exact = _median_time(partial(nearest, q, g, 10, cuts=(1, 5, 10)), repeats)
            t_plain, plain = _median_time(partial(plain_topk, q, g, 10), repeats)
            rows = [("moquad exact (tie rule)", 1.0, 0.0, t_exact, 1.0),
                    ("plain fp32 matmul + topk", recall_at(plain.numpy(), exact, (10,))["recall@10"], 0.0, t_plain,
                     t_exact / t_plain)]
            table += _print(n, kind, rows)
            for name, build, searches, largest in LANCE:
                if name in indexes and n <= largest:
                    table += _print(n, kind, _lance_rows(name, dict(build), searches, g, q.numpy(), exact, t_exact,
                                                         repeats, tmp))
    rec.table("gallery", ["gallery", "method", "recall@10", "build (s)", "query (s)", "vs exact"], table, align="llrrrr",
              title=f"Galleries of unit 512-d vectors, {n_queries:,} queries, top-10, median of {repeats}", show=False)


def _print(n: int, kind: str, rows: list[tuple]) -> list[list]:
    out = []
    for label, recall, tb, tq, speed in rows:
        print(f"{f'{n:,} {kind}':<20}{label:<52}{recall:>10.4f}{tb:>11.1f}{tq:>11.3f}{speed:>9.1f}x", flush=True)
        out.append([f"{n:,} {kind}", label, f"{recall:.4f}", f"{tb:.1f}", f"{tq:.3f}", f"{speed:.1f}x"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="exact,gallery", help="exact, gallery or both (comma-separated)")
    ap.add_argument("--sizes", default="10000,100000", help="gallery sizes, comma-separated")
    ap.add_argument("--kinds", default="random,clustered")
    ap.add_argument("--indexes", default=",".join(x[0] for x in LANCE), help="Lance index types to build")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="part 1 only")
    ap.add_argument("--tmp", default=None, help="folder for the Lance datasets (default: a temp dir)")
    add_argument(ap, "bench_retrieval")
    args = ap.parse_args()
    rec = Record("bench_retrieval")
    parts = args.part.split(",")
    if "exact" in parts:
        part_exact(rec, args.repeats, args.device)
    if "gallery" in parts:
        tmp = Path(args.tmp or tempfile.mkdtemp(prefix="bench_retrieval_"))
        try:
            part_gallery(rec, [int(x) for x in args.sizes.split(",")], args.kinds.split(","), args.queries,
                         args.clusters, args.repeats, tmp, args.indexes.split(","))
        finally:
            if not args.tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    rec.write(args.record)


if __name__ == "__main__":
    main()
