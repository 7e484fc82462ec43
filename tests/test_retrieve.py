"""Retrieval top-k and weighted kNN against independent references, with ties; the protocol end to end."""

from __future__ import annotations

import json

import cli_child as clirun
import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

import moquad.eval.search as R
from moquad.eval.ann import recall_at
from moquad.eval.retrieve import hits_at, knn_classify, retrieve
from moquad.eval.search import fp32_error_bound, nearest, prepare

KS = (1, 2, 5, 10, 20, 50)


def topk_retrieval(q, q_labels, g, g_labels, ks, center=False):
    """hit@k of queries ``q`` against gallery ``g`` through the product's exact search and hit rule."""
    q_labels, g_labels = np.asarray(q_labels), np.asarray(g_labels)
    nn = nearest(prepare(q, center), prepare(g, center), max(ks), cuts=ks)
    return hits_at(nn, q_labels, g_labels, ks)


def _loop_reference(q, ql, g, gl, ks, center):
    """Direct loop: cosine per pair in float64, order by (-similarity, gallery index), any-hit in the first k."""
    if center:
        q, g = q - q.mean(0), g - g.mean(0)
    res = {}
    for k in ks:
        hits = 0
        for i in range(len(q)):
            sims = [float(np.dot(q[i], g[j]) / (np.linalg.norm(q[i]) * np.linalg.norm(g[j]))) for j in range(len(g))]
            order = sorted(range(len(g)), key=lambda j: (-sims[j], j))[: min(k, len(g))]
            hits += any(gl[j] == ql[i] for j in order)
        res[f"hit@{k}"] = hits / len(q)
    return res


def _tied_features(seed):
    """Integer features (exact float arithmetic) and a gallery with duplicated rows of DIFFERENT classes."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-3, 4, (12, 8)).astype(np.float64)
    g = np.concatenate([base, base[:6], base[:3] * 2.0])  # duplicates and scaled copies: exact cosine ties
    gl = rng.integers(0, 4, len(g))
    q = np.concatenate([base[:5], rng.integers(-3, 4, (10, 8))]).astype(np.float64)
    ql = rng.integers(0, 4, len(q))
    return q, ql, g, gl


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("center", [False, True])
def test_topk_matches_loop_reference_with_ties(seed, center):
    q, ql, g, gl = _tied_features(seed)
    got = topk_retrieval(q, ql, g, gl, KS, center=center)
    assert got == pytest.approx(_loop_reference(q, ql, g, gl, KS, center))


def test_tie_rule_lower_gallery_index_wins():
    g = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # rows 0 and 1 tie for every query
    q = np.array([[2.0, 0.1]])
    assert topk_retrieval(q, [1], g, [0, 1, 1], (1, 2)) == {"hit@1": 0.0, "hit@2": 1.0}
    assert topk_retrieval(q, [0], g, [0, 1, 1], (1,)) == {"hit@1": 1.0}


def test_nearest_matches_sklearn_without_ties():
    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(40, 16)), rng.normal(size=(300, 16))
    ours = nearest(prepare(q, False), prepare(g, False), 10, chunk=7)
    ref = NearestNeighbors(n_neighbors=10, metric="cosine", algorithm="brute").fit(g).kneighbors(q)[1]
    np.testing.assert_array_equal(ours, ref)
    ql, gl = rng.integers(0, 5, 40), rng.integers(0, 5, 300)
    want = {f"hit@{k}": float((gl[ref[:, :k]] == ql[:, None]).any(1).mean()) for k in (1, 5, 10)}
    assert topk_retrieval(q, ql, g, gl, (1, 5, 10)) == pytest.approx(want)


def test_centering_uses_each_splits_own_mean():
    rng = np.random.default_rng(4)
    q, g = rng.normal(size=(20, 6)) + 5.0, rng.normal(size=(30, 6)) - 3.0  # different offsets per split
    ql, gl = rng.integers(0, 3, 20), rng.integers(0, 3, 30)
    got = topk_retrieval(q, ql, g, gl, (1, 3), center=True)
    want = topk_retrieval(q - q.mean(0), ql, g - g.mean(0), gl, (1, 3))
    assert got == want


def test_recall():
    exact = np.array([[0, 1, 2], [3, 4, 5]])
    assert recall_at(np.array([[0, 2, 9], [3, 4, 5]]), exact, (1, 3)) == {"recall@1": 1.0, "recall@3": pytest.approx(5 / 6)}


def test_retrieve_end_to_end_with_lance_index(tmp_path, monkeypatch):
    import functools

    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    import moquad.digest as digest

    data = make_tiny_dataset(tmp_path / "data", {"train": 9, "test": 4}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", ks=(1, 5, 20), index="lance", num_clips=1)
    hashed, real = [], digest._sha256.__wrapped__
    monkeypatch.setattr(digest, "_sha256", functools.lru_cache(lambda path, *key: hashed.append(path) or real(path, *key)))
    res = retrieve(cfg)
    assert hashed == [str(ckpt.resolve())]  # the checkpoint is read for its hash once per command
    assert (tmp_path / "out" / "features" / "train.lance").is_dir()  # extracted first (no cache)
    assert res["queries"] == 4 and res["gallery"] == 9 and res["k_capped"] == [20]
    assert res["top1"] == res["exact"]["hit@1"] and res["exact"]["hit@20"] == 1.0 and res["lance"]["recall@20"] == 1.0  # whole gallery
    from moquad.eval.features import read_features

    qf, gf = read_features(tmp_path / "out/features/test.lance"), read_features(tmp_path / "out/features/train.lance")
    assert res["exact"] == topk_retrieval(qf["embedding"], qf["label"], gf["embedding"], gf["label"], (1, 5, 20))
    saved = json.loads((tmp_path / "out" / "retrieval.json").read_text())
    assert saved["checkpoint"]["sha256"] == qf["metadata"]["checkpoint_sha256"]
    assert set(saved["data"]["manifests"]) == {"test", "train"} and saved["protocol"]["index"] == "lance"
    assert "hit@k exact" in (tmp_path / "out" / "retrieval.txt").read_text()


# ----------------------------------------------------------------------------- exact nearest at matmul speed


def _float64_nearest(q, g, k):
    """The documented rule, straightforwardly: float64 similarities rounded to 1e-9, sorted by (-sim, index)."""
    sim = np.round(q @ g.T, 9)
    return np.stack([np.lexsort((np.arange(len(g)), -row))[: min(k, len(g))] for row in sim])


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _near_tie_gallery(rng, n, d):
    """Random unit rows plus groups that tie exactly (copies), tie below 1e-9 (1e-12 apart, the same after
    rounding) and nearly tie (1e-7 .. 1e-5 apart: below float32's resolution, above the tie resolution)."""
    g = _unit(rng.normal(size=(n, d)))
    base = g[rng.choice(n, 12, replace=False)]
    groups = [base[:4]]  # exact copies
    for eps in (1e-12, 1e-7, 1e-6, 1e-5):
        groups.append(_unit(base[4:12] + eps * rng.normal(size=(8, d))))
    g = np.concatenate([g, *groups, base[:4]])
    return g[rng.permutation(len(g))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nearest_equals_float64_rule_with_planted_ties(seed):
    rng = np.random.default_rng(seed)
    g = _near_tie_gallery(rng, 600, 48)
    # queries: gallery rows themselves (their copies and near-copies tie at the top) and random ones
    q = np.concatenate([g[rng.choice(len(g), 40)], _unit(g[rng.choice(len(g), 20)] + 1e-3 * rng.normal(size=(20, 48))),
                        _unit(rng.normal(size=(20, 48)))])
    for k in (1, 5, 10, 50):
        np.testing.assert_array_equal(nearest(q, g, k, chunk=17), _float64_nearest(q, g, k))


def test_nearest_equals_float64_rule_on_random_data_and_small_galleries():
    rng = np.random.default_rng(5)
    q, g = _unit(rng.normal(size=(300, 512))), _unit(rng.normal(size=(2000, 512)))
    np.testing.assert_array_equal(nearest(q, g, 50), _float64_nearest(q, g, 50))
    for n in (1, 3, 12):  # k + margin larger than the gallery: every row is a candidate
        np.testing.assert_array_equal(nearest(q[:30], g[:n], 10), _float64_nearest(q[:30], g[:n], 10))
    assert nearest(q[:0], g, 5).shape == (0, 5)


def test_long_near_tie_run_falls_back_to_whole_row(monkeypatch):
    """A run of near-ties longer than k + margin: the candidates cannot show where it ends -> float64 row."""
    rng = np.random.default_rng(7)
    d = 32
    anchor = _unit(rng.normal(size=(1, d)))
    crowd = _unit(anchor + 1e-7 * rng.normal(size=(3 * R.MARGIN + 30, d)))  # all within float32 noise
    g = np.concatenate([_unit(rng.normal(size=(200, d))), crowd])[rng.permutation(200 + len(crowd))]
    calls = []
    real = R._exact_rows
    monkeypatch.setattr(R, "_exact_rows", lambda q, g, k: calls.append(len(q)) or real(q, g, k))
    q = np.concatenate([anchor, _unit(rng.normal(size=(5, d)))])
    np.testing.assert_array_equal(nearest(q, g, 10), _float64_nearest(q, g, 10))
    assert calls and sum(calls) >= 1  # the anchor's row went through the whole-row path


def test_fp32_error_bound_holds():
    """|float32 - float64| similarity never exceeds the bound, also with heavy cancellation."""
    rng = np.random.default_rng(1)
    for d in (16, 512):
        x = rng.normal(size=(200, d)) * rng.choice([1e-3, 1.0, 1e3], size=(200, d))  # mixed magnitudes: cancellation
        q, g = _unit(x[:50]), _unit(x[50:])
        err = np.abs((torch.from_numpy(q).float() @ torch.from_numpy(g).float().T).double().numpy() - q @ g.T)
        assert err.max() <= fp32_error_bound(d)
    assert fp32_error_bound(512) == pytest.approx(514 * 2.0**-24, rel=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nearest_on_gpu_equals_float64_rule():
    rng = np.random.default_rng(11)
    g = _near_tie_gallery(rng, 5000, 128)
    q = np.concatenate([g[rng.choice(len(g), 300)], _unit(rng.normal(size=(300, 128)))])
    got = nearest(torch.from_numpy(q).cuda(), torch.from_numpy(g).cuda(), 20)
    np.testing.assert_array_equal(got, _float64_nearest(q, g, 20))


# ----------------------------------------------------------------------------- weighted kNN (DINO protocol)


def _knn_loop(q, ql, g, gl, k, t):
    """Direct per-query loop: cosine, k nearest by (-rounded sim, index), votes exp(sim / t) per class."""
    top1 = top5 = 0
    right: dict[int, list[bool]] = {}
    for i in range(len(q)):
        sims = [float(np.dot(q[i], g[j]) / (np.linalg.norm(q[i]) * np.linalg.norm(g[j]))) for j in range(len(g))]
        order = sorted(range(len(g)), key=lambda j: (-round(sims[j], 9), j))[:k]
        votes: dict[int, float] = {}
        for j in order:
            votes[int(gl[j])] = votes.get(int(gl[j]), 0.0) + np.exp(sims[j] / t)
        ranked = sorted(votes, key=lambda c: (-votes[c], c))
        top1 += ranked[0] == ql[i]
        top5 += ql[i] in ranked[:5]
        right.setdefault(int(ql[i]), []).append(ranked[0] == ql[i])
    return {"knn_top1": top1 / len(q), "knn_top5": top5 / len(q),
            "per_class_top1": {c: sum(r) / len(r) for c, r in sorted(right.items())}}


@pytest.mark.parametrize("k, t", [(20, 0.07), (1, 0.07), (3, 0.5), (7, 0.01)])
def test_knn_matches_direct_loop(k, t):
    rng = np.random.default_rng(k)
    centres = rng.normal(size=(8, 16))
    gl = rng.integers(0, 8, 150)
    g = centres[gl] + 1.2 * rng.normal(size=(150, 16))
    ql = rng.integers(0, 8, 60)
    q = centres[ql] + 1.2 * rng.normal(size=(60, 16))
    g[:5] = g[5:10]  # exact ties between gallery rows of (probably) different classes
    gl[3] = -1  # an unlabelled gallery video votes for an 'unknown' class
    qp, gp = prepare(q, False), prepare(g, False)
    nn = nearest(qp, gp, k)
    got, want = knn_classify(qp, gp, nn, ql, gl, k, t), _knn_loop(q, ql, g, gl, k, t)
    assert got["per_class_top1"] == pytest.approx(want.pop("per_class_top1"))
    assert {k: v for k, v in got.items() if k != "per_class_top1"} == pytest.approx(want)
    assert 0.0 < got["knn_top1"] <= got["knn_top5"]


def test_knn_small_temperature_does_not_overflow():
    g = prepare(np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]), False)
    q = prepare(np.array([[1.0, 0.05]]), False)
    res = knn_classify(q, g, nearest(q, g, 3), np.array([1]), np.array([0, 1, 1]), k=3, t=1e-4)
    assert res == {"knn_top1": 0.0, "knn_top5": 1.0, "per_class_top1": {1: 0.0}}  # weight of the single nearest (class 0) dominates


def test_retrieve_cli_reports_knn(tmp_path):
    from test_features import make_checkpoint, make_tiny_dataset

    from moquad.eval.features import read_features

    data = make_tiny_dataset(tmp_path / "data", {"train": 9, "test": 4}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    base = ["-m", "moquad.cli", "retrieve", "--data", str(data), "--checkpoint", str(ckpt),
            "--num-clips", "1", "--frames", "4", "--size", "32", "--device", "cpu", "--out", str(tmp_path / "out")]
    res = clirun.python(*base, "--knn-k", "3", "--knn-t", "0.1")
    assert res.returncode == 0, res.stderr
    assert "weighted kNN" in res.stdout
    saved = json.loads((tmp_path / "out" / "retrieval.json").read_text())
    qf, gf = read_features(tmp_path / "out/features/test.lance"), read_features(tmp_path / "out/features/train.lance")
    want = _knn_loop(qf["embedding"].astype(np.float64), qf["label"], gf["embedding"].astype(np.float64), gf["label"], 3, 0.1)
    assert saved["knn"]["k"] == 3 and saved["knn"]["t"] == 0.1
    names = dict(zip(qf["label"].tolist(), qf["class_name"]))  # per class, by name
    assert saved["knn"]["per_class_top1"] == pytest.approx({names[c]: v for c, v in want.pop("per_class_top1").items()})
    assert {k: saved[k] for k in want} == pytest.approx(want)
    bad = clirun.python(*base, "--knn-t", "0")
    lines = [x for x in bad.stderr.splitlines() if x.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "knn_t must be > 0" in lines[0]


def test_nearest_cuts_give_exact_sets_at_each_cut():
    """With ``cuts`` only the prefix SETS at the cuts are the rule's (what hit@k needs), at less float64 work."""
    rng = np.random.default_rng(3)
    g = _near_tie_gallery(rng, 800, 48)
    q = np.concatenate([g[rng.choice(len(g), 60)], _unit(rng.normal(size=(40, 48)))])
    cuts = (1, 5, 10, 20)
    got, want = nearest(q, g, 20, cuts=cuts), _float64_nearest(q, g, 20)
    for c in cuts:
        np.testing.assert_array_equal(np.sort(got[:, :c], axis=1), np.sort(want[:, :c], axis=1))


def test_table_marks_capped_hit_at_k(tmp_path):
    """k >= the gallery size retrieves every gallery video: hit@k is 100 % by construction, and the printed table and
    the .txt say so (hit@20 = 100 % against a 13-video gallery is no result)."""
    from rich.console import Console

    from moquad.config import EvalConfig
    from moquad.eval.report import write_result
    from moquad.eval.retrieve import _tables

    ks = (1, 5, 13, 20)
    result = {"exact": {f"hit@{k}": v for k, v in zip(ks, (0.5, 0.75, 1.0, 1.0))}, "gallery": 13,
              "knn": {"k": 13, "t": 0.07, "knn_top1": 0.5, "knn_top5": 0.75},
              "checkpoint": None, "splits": {"train": "train", "test": "test"},
              "data": {"dir": "/d", "manifests": {}}}
    console = Console(record=True, width=110)
    for t in _tables(EvalConfig(ks=ks), result, "retrieval"):
        console.print(t)
    text = console.export_text()
    hits = text.split("weighted kNN")[0]  # the hit@k table (the kNN table's k is 13 too)
    rows = {line.split()[1]: line for line in hits.splitlines() if line.startswith("│")}
    assert [k for k in ("1", "5", "13", "20") if "*" in rows[k]] == ["13", "20"]  # k >= 13 marked, k = 5 not
    assert "* capped: k >= the 13-video gallery, 100 % by construction" in text
    write_result(result, tmp_path / "retrieval.json", _tables(EvalConfig(ks=ks), result, "retrieval"))
    assert "20 *" in (tmp_path / "retrieval.txt").read_text()
