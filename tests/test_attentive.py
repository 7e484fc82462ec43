"""The attentive probe: the pooler against transformers' V-JEPA 2 pooler and a float64 formula, what attention buys
over a mean, the protocol end to end (moquad checkpoint and a Hugging Face folder), its recipe."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

from moquad import config as C
from moquad import settings
from moquad.errors import MoquadError
from moquad.eval import attentive as A
from moquad.eval.linear import fit_logistic


def _copy_into_hf(clf: A.AttentiveClassifier, depth: int, heads: int):
    """transformers' VJEPA2AttentivePooler with ``clf``'s weights (its q / k / v projections are ours split)."""
    T = pytest.importorskip("transformers")
    from transformers.models.vjepa2.modeling_vjepa2 import VJEPA2AttentivePooler

    dim = clf.query.shape[-1]
    cfg = T.VJEPA2Config(hidden_size=dim, num_attention_heads=heads, mlp_ratio=4.0, num_pooler_layers=depth - 1,
                         layer_norm_eps=1e-5, hidden_act="gelu")  # V-JEPA 2's nn.LayerNorm, nn.GELU
    ref = VJEPA2AttentivePooler(cfg).eval()

    def put(dst, w, b):
        dst.weight.data.copy_(w)
        dst.bias.data.copy_(b)

    def block(dst, src, cross: bool) -> None:
        put(dst.layer_norm1, src.norm1.weight, src.norm1.bias)
        put(dst.layer_norm2, src.norm2.weight, src.norm2.bias)
        put(dst.mlp.fc1, src.mlp.fc1.weight, src.mlp.fc1.bias)
        put(dst.mlp.fc2, src.mlp.fc2.weight, src.mlp.fc2.bias)
        attn = dst.cross_attn if cross else dst.self_attn
        if cross:
            put(attn.q_proj, src.q.weight, src.q.bias)
            w, b = src.kv.weight.chunk(2), src.kv.bias.chunk(2)
            put(attn.k_proj, w[0], b[0])
            put(attn.v_proj, w[1], b[1])
        else:
            w, b = src.qkv.weight.chunk(3), src.qkv.bias.chunk(3)
            for proj, ww, bb in zip((attn.q_proj, attn.k_proj, attn.v_proj), w, b):
                put(proj, ww, bb)
            put(attn.out_proj, src.proj.weight, src.proj.bias)

    ref.query_tokens.data.copy_(clf.query)
    for dst, src in zip(ref.self_attention_layers, clf.blocks):
        block(dst, src, cross=False)
    block(ref.cross_attention_layer, clf.cross, cross=True)
    return ref


@pytest.mark.parametrize("depth", [1, 4])
def test_pooler_is_transformers_vjepa2_pooler(depth):
    torch.manual_seed(0)
    clf = A.AttentiveClassifier(32, 5, depth=depth, heads=4).eval()
    ref = _copy_into_hf(clf, depth, 4)
    x = torch.randn(3, 20, 32)
    with torch.no_grad():
        torch.testing.assert_close(clf.pool(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(clf(x), clf.linear(ref(x)), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_cross_block_against_a_float64_formula():
    torch.manual_seed(1)
    blk = A.CrossBlock(8, heads=2, mlp_ratio=2.0).double()
    for p in blk.parameters():
        p.data.normal_(0, 0.5)
    q, x = torch.randn(2, 1, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)

    def ln(v, m):
        return (v - v.mean(-1, keepdim=True)) / torch.sqrt(v.var(-1, unbiased=False, keepdim=True) + m.eps) \
            * m.weight + m.bias

    want = torch.empty_like(q)
    for b in range(2):
        xn = ln(x[b], blk.norm1)
        qq = blk.q.weight @ q[b, 0] + blk.q.bias
        kv = xn @ blk.kv.weight.T + blk.kv.bias
        k, v = kv[:, :8], kv[:, 8:]
        out = []
        for h in range(2):
            s = slice(4 * h, 4 * h + 4)
            logits = [float(qq[s] @ k[j, s]) / math.sqrt(4) for j in range(5)]
            w = np.exp(np.array(logits) - max(logits))
            out.append(sum(wj / w.sum() * v[j, s] for j, wj in enumerate(w)))
        q1 = q[b, 0] + torch.cat(out)
        hidden = blk.mlp.fc1.weight @ ln(q1, blk.norm2) + blk.mlp.fc1.bias
        gelu = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))
        want[b, 0] = q1 + blk.mlp.fc2.weight @ gelu + blk.mlp.fc2.bias
    torch.testing.assert_close(blk(q, x), want, atol=1e-12, rtol=1e-12)


def test_init_follows_vjepa2():
    """Truncated-normal 0.02 weights and zero biases in the pooler, its blocks' output layers scaled by
    1 / sqrt(2 * layer), the cross block's MLP by 1 / sqrt(2 * (depth - 1))."""
    torch.manual_seed(0)
    clf = A.AttentiveClassifier(256, 3, depth=4, heads=8)
    for i, b in enumerate(clf.blocks, 1):
        assert b.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05) and b.qkv.bias.abs().max() == 0
        assert b.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * i), rel=0.05)
    assert clf.cross.mlp.fc2.weight.std().item() == pytest.approx(0.02 / math.sqrt(6), rel=0.05)
    with pytest.raises(MoquadError, match=r"heads \(3\) must divide the token width \(256\)"):
        A.AttentiveClassifier(256, 3, heads=3)


def test_attention_finds_the_token_a_mean_dilutes():
    """One token in 16 is flagged (+4 on axis 1) and carries the class (+3 or -3 on axis 0), the rest is noise: the
    query learns to attend to the flag and reads the class; a logistic regression on the tokens' mean (the linear
    probe's pooled feature) sees a sixteenth of it."""
    rng = np.random.default_rng(0)
    n, length, dim = 800, 16, 8
    y = rng.integers(0, 2, n)
    tok = rng.normal(size=(n, 1, length, dim)).astype(np.float32)
    at = rng.integers(0, length, n)
    tok[np.arange(n), 0, at, 0] = np.where(y == 1, 3.0, -3.0)
    tok[np.arange(n), 0, at, 1] = 4.0
    ac = C.AttentiveConfig(depth=1, heads=2, epochs=25, lr=1e-2, batch_size=32)
    clf = A.fit_attentive(tok[:400], y[:400], 2, ac, seed=0)
    probe = (A.predict(clf, tok[400:]).argmax(1) == y[400:]).mean()
    mean = tok.mean((1, 2)).astype(np.float64)
    mu, sd = mean[:400].mean(0), mean[:400].std(0)
    lin = fit_logistic((mean[:400] - mu) / sd, y[:400], 2, 1e-4)
    with torch.no_grad():
        linear = (lin(torch.as_tensor((mean[400:] - mu) / sd)).argmax(1).numpy() == y[400:]).mean()
    assert probe >= 0.9 and linear < 0.8, (probe, linear)  # measured: 0.94 and 0.745


def test_predict_averages_softmax_over_crops():
    torch.manual_seed(0)
    clf = A.AttentiveClassifier(8, 3, depth=1, heads=2).eval()
    tok = np.random.default_rng(0).normal(size=(5, 3, 4, 8)).astype(np.float32)
    with torch.no_grad():
        want = np.stack([clf(torch.from_numpy(tok[v])).softmax(-1).mean(0).numpy() for v in range(5)])
    np.testing.assert_allclose(A.predict(clf, tok, batch_size=2), want, atol=1e-6)


def test_tokens_are_standardised_with_the_training_tokens_stats():
    """Per-channel mean / std of every training token (numpy's, float64), applied before the pooler: a token scale
    (a random CNN's ~0.02) changes nothing the probe computes."""
    rng = np.random.default_rng(0)
    tok = (rng.normal(size=(10, 2, 6, 8)) * rng.uniform(0.01, 3, 8) + rng.normal(size=8)).astype(np.float32)
    mean, std = A.token_stats(tok, chunk=3)
    np.testing.assert_allclose(mean, tok.reshape(-1, 8).astype(np.float64).mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(std, tok.reshape(-1, 8).astype(np.float64).std(0) + 1e-6, rtol=1e-5)
    y = np.arange(10) % 2
    ac = C.AttentiveConfig(depth=2, heads=2, epochs=2, batch_size=4)
    a, b = A.fit_attentive(tok, y, 2, ac, seed=0), A.fit_attentive(tok * 50, y, 2, ac, seed=0)
    np.testing.assert_allclose(A.predict(a, tok), A.predict(b, tok * 50), atol=1e-5)


def test_video_tokens_concatenate_a_crops_clips():
    class Grid(torch.nn.Module):
        """Tokens whose value says (view, position): view v (its pixels all v) gives tokens 100 v + p, p = 0..3."""

        def tokens(self, x):
            v = x[:, 0, 0, 0, 0].view(-1, 1, 1, 1, 1) * 100
            return (v + torch.arange(4, dtype=torch.float32).view(1, 1, 1, 2, 2)).expand(-1, 2, -1, -1, -1)

        def normalize(self, x, device):
            return x.float()

    views = torch.arange(6, dtype=torch.uint8).view(6, 1, 1, 1, 1).expand(6, 3, 2, 8, 8)  # 2 clips x 3 crops
    out = A.video_tokens(Grid(), views, num_clips=2, batch_size=4, device="cpu")
    assert out.shape == (3, 8, 2)  # (crops, clips * 4 tokens, C)
    np.testing.assert_array_equal(out[1, :, 0], [100, 101, 102, 103, 400, 401, 402, 403])  # crop 1: views 1, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("attentive")
    return make_tiny_dataset(root / "data", {"train": 8, "test": 6}), \
        make_checkpoint(root / "run" / "checkpoints" / "last.pt", loader={"frames": 4, "size": 32})


def _quick(**kw) -> dict:
    return {"attentive": {"depth": 2, "heads": 4, "epochs": 3, "batch_size": 4}, **kw}


def test_protocol_end_to_end_on_a_checkpoint(tiny, tmp_path):
    data, ckpt = tiny
    cfg = eval_cfg(data, ckpt, tmp_path / "out", crops=3, **_quick())
    res = A.attentive(cfg, json_path=tmp_path / "copy.json")
    saved = json.loads((tmp_path / "out" / "attentive.json").read_text())
    assert saved == json.loads((tmp_path / "copy.json").read_text())
    assert saved["task"] == "attentive" and saved["videos"] == 6 and 0 <= saved["top1"] <= 1
    assert saved["clip"]["frames"] == 4 and saved["views"] == {"clips": 2, "crops": 3, "per_video": 6}
    assert saved["checkpoint"]["sha256"] and saved["encoder"]["family"] == "moquad"
    assert "softmax averaged over crops" in saved["protocol"]["test"]
    tok = np.load(tmp_path / "out" / "tokens" / "test.npy", mmap_mode="r")
    assert tok.shape == (6, 3, 2 * 1 * 4 * 4, 64)  # tiny net: stride 4 in time, 8 in space; 2 clips per crop
    conf = np.array(saved["confusion"])
    assert conf.sum() == 6 and np.trace(conf) == round(saved["top1"] * 6)
    assert res["json"] == str(tmp_path / "out" / "attentive.json")


def test_protocol_runs_a_hugging_face_folder(tiny, tmp_path):
    """Any encoder of the table: a tiny V-JEPA 2 folder, at its own clip (8 frames of 32 px, frame step 4)."""
    from test_encoders import save

    from moquad.eval.encoders import load_encoder

    data, _ = tiny
    folder, _, _ = save(tmp_path, "vjepa2")
    cfg = eval_cfg(data, "", tmp_path / "out", frames=None, size=None, dilation=None, **_quick())
    res = A.attentive(cfg, encoder=load_encoder(f"hf:{folder}"))
    assert res["checkpoint"] is None and res["encoder"]["family"] == "vjepa2"
    assert (res["clip"]["frames"], res["clip"]["size"], res["clip"]["dilation"]) == (8, 32, 4)
    assert np.load(tmp_path / "out" / "tokens" / "train.npy", mmap_mode="r").shape == (8, 1, 2 * 4 * 4 * 4, 32)
    with pytest.raises(MoquadError, match="takes exactly 32 x 32 px|exactly 32 x 32 px"):
        A.attentive(eval_cfg(data, "", tmp_path / "o2", frames=None, size=48, dilation=None, **_quick()),
                    encoder=load_encoder(f"hf:{folder}"))


def test_recipe_is_vjepa2s_ssv2_protocol():
    cfg = settings.resolve(C.EvalConfig(), "eval/attentive_ssv2.yaml", {})
    assert (cfg.frames, cfg.dilation, cfg.num_clips, cfg.crops, cfg.size) == (16, 4, 2, 3, None)
    assert (cfg.train_split, cfg.test_split) == ("train", "val")
    ac = cfg.attentive  # configs/eval/vitl/ssv2.yaml: 4 probe blocks, 16 heads, 20 epochs, 4 x 64 GPUs
    assert (ac.depth, ac.heads, ac.epochs, ac.batch_size, ac.optimizer) == (4, 16, 20, 256, "adamw")
    assert 1e-4 <= ac.lr <= 5e-3 and 0.01 <= ac.weight_decay <= 0.8  # inside V-JEPA 2's grid
