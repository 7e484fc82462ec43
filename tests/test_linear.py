"""Linear probe: frozen backbone provably untouched; the classifier against scikit-learn; end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from moquad.eval.common import check_unchanged, snapshot
from moquad.eval.linear import fit_logistic, linear


def test_logistic_separable_and_matches_sklearn():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 10)) * 4
    y = rng.integers(0, 4, 200)
    x = centres[y] + rng.normal(size=(200, 10))
    clf = fit_logistic(x[:150], y[:150], 4, weight_decay=1e-2)
    with torch.no_grad():
        pred = clf(torch.as_tensor(x[150:])).argmax(1).numpy()
    assert (pred == y[150:]).mean() == 1.0
    # same objective as sklearn's multinomial LR with C = 1 / (n * weight_decay)
    ref = LogisticRegression(C=1 / (150 * 1e-2), max_iter=5000, tol=1e-10).fit(x[:150], y[:150])
    with torch.no_grad():
        ours = clf(torch.as_tensor(x)).softmax(1).numpy()
    np.testing.assert_allclose(ours, ref.predict_proba(x), atol=2e-3)


def test_sanity_check_catches_bn_statistics_and_weights():
    net = torch.nn.Sequential(torch.nn.Conv3d(3, 4, 1), torch.nn.BatchNorm3d(4))
    before = snapshot(net)
    net.eval()(torch.randn(2, 3, 2, 4, 4))
    check_unchanged(net, before)  # eval forward: nothing moves
    net.train()(torch.randn(2, 3, 2, 4, 4))  # a train-mode forward updates running stats
    with pytest.raises(RuntimeError, match="changed"):
        check_unchanged(net, before)
    before = snapshot(net)
    with torch.no_grad():
        net[0].weight[0, 0] += 1e-7
    with pytest.raises(RuntimeError, match="0.weight"):
        check_unchanged(net, before)


def test_cvrl_probe_leaves_backbone_untouched(tmp_path, monkeypatch):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 6, "test": 3}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    from moquad.eval.encoders import load_encoder

    seen = {"encoder": load_encoder(str(ckpt))}  # the encoder the command hands the protocol
    cfg = eval_cfg(data, ckpt, tmp_path / "out", frames=4, dilation=1,
                   linear={"epochs": 2, "batch_size": 4, "lr": 0.5, "optimizer": "sgd"})
    res = linear(cfg, fast=False, encoder=seen["encoder"])
    original = torch.load(ckpt, weights_only=True)["model"]
    after = seen["encoder"].net.state_dict()
    bb = [k for k in original if k.startswith("backbone.")]
    assert any("running_mean" in k for k in bb) and any("num_batches_tracked" in k for k in bb)
    for k in bb:  # independent check against the checkpoint file: weights AND BN buffers
        assert torch.equal(after[k[len("backbone."):]].cpu(), original[k]), k
    assert res["videos"] == 3 and 0.0 <= res["top1"] <= 1.0
    assert "unchanged" in res["protocol"]["backbone_check"]
    assert (tmp_path / "out" / "linear_cvrl.json").is_file() and (tmp_path / "out" / "linear_cvrl.txt").is_file()


def test_fast_probe_end_to_end(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 12, "test": 6}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, None, num_clips=1)
    res = linear(cfg)
    out = tmp_path / "run" / "eval"  # default: next to the checkpoint's run folder
    saved = json.loads((out / "linear_fast.json").read_text())
    assert saved["top1"] == res["top1"] and res["videos"] == 6
    assert res["top1"] >= 0.8  # classes differ by colour: separable even for a random backbone
    assert sum(r["videos"] for r in res["per_class"]) == 6 and np.sum(res["confusion"]) == 6
    assert saved["data"]["manifests"]["train"]["videos"] == 12 and len(saved["checkpoint"]["sha256"]) == 64
    assert "per-class accuracy" in (out / "linear_fast.txt").read_text()


def test_full_protocol_does_not_import_lance():
    """Lance is not fork-safe: the --full probe (DataLoader workers fork) must not import it."""
    import subprocess
    import sys

    code = "import sys, moquad.eval.linear; assert 'lance' not in sys.modules, 'lance imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
