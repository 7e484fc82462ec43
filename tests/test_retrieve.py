"""Retrieval top-k against independent references, with ties; the full protocol end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

from moquad.eval.retrieve import nearest, prepare, recall_at, retrieve, topk_retrieval

KS = (1, 2, 5, 10, 20, 50)


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


def test_recall_and_errors():
    exact = np.array([[0, 1, 2], [3, 4, 5]])
    assert recall_at(np.array([[0, 2, 9], [3, 4, 5]]), exact, (1, 3)) == {"recall@1": 1.0, "recall@3": pytest.approx(5 / 6)}
    with pytest.raises(ValueError, match="same number"):
        topk_retrieval(np.zeros((2, 3)), [0], np.zeros((2, 3)), [0, 1])


def test_retrieve_end_to_end_with_lance_index(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 9, "test": 4}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", ks=(1, 5, 20), index="lance", num_clips=1)
    res = retrieve(cfg)
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
