"""Losses against direct element-by-element loops (float64) and, for NT-Xent, pytorch-metric-learning."""

from __future__ import annotations

import math

import pytest
import torch

from moquad.train.losses import appearance_loss, hard_k, moquad_loss, nt_xent_loss, role_views

QUAD = ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")
ROLE = {"anchor": "anchor", "ad_pos": "positive", "pos": "positive", "intra_neg": "intra_negative",
        "ad_intra_neg": "intra_negative"}


def roles(names):
    """The loss's roles of views named as the loader names them (tests keep the names readable)."""
    return tuple(ROLE[n.split(":")[0]] for n in names)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt(sum(x**2 for x in v))


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return sum(a[k] * b[k] for k in range(a.shape[0]))


def ref_quad(z, names, tau, beta, alpha, anchors, videos=None):
    """Eq. 1 / Eq. 4 written out: one anchor, one candidate at a time (inter negatives: other videos)."""
    g, v, _ = z.shape
    videos = list(range(g)) if videos is None else videos
    zn = [[_unit(z[j, s]) for s in range(v)] for j in range(g)]
    pos_v = [k for k, n in enumerate(names) if n in ("ad_pos", "pos")][0]
    intra_v = [k for k, n in enumerate(names) if n in ("intra_neg", "ad_intra_neg")]
    total, ranks_pos, ranks_intra = 0.0, [], []
    for i in anchors:
        a = zn[i][0]
        s_pos = _dot(a, zn[i][pos_v])
        s_intra = [_dot(a, zn[i][k]) for k in intra_v]
        s_inter = [_dot(a, zn[j][s]) for j in range(g) if videos[j] != videos[i] for s in range(v)]
        k = 0 if beta == 0 else max(1, int(beta * len(s_inter)))  # over this anchor's unmasked negatives
        order = sorted(range(len(s_inter)), key=lambda t: -s_inter[t].item())
        hard = set(order[:k])
        w_intra = alpha if k else 1.0
        denom = torch.exp(s_pos / tau)
        for s in s_intra:
            denom = denom + w_intra * torch.exp(s / tau)
        for t, s in enumerate(s_inter):
            denom = denom + (alpha if t in hard else 1.0) * torch.exp(s / tau)
        total = total - torch.log(torch.exp(s_pos / tau) / denom)
        cands = [s.item() for s in [s_pos, *s_intra, *s_inter]]
        ranks_pos.append(1 + sum(c > s_pos.item() for c in cands))
        ranks_intra += [1 + sum(c > s.item() for c in cands) for s in s_intra]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return total / len(anchors), mean(ranks_pos), mean(ranks_intra)


def _grad(fn, z):
    z = z.clone().requires_grad_(True)
    out = fn(z)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return loss.detach(), z.grad


@pytest.mark.parametrize(
    "names",
    [QUAD, ("anchor", "ad_pos"), ("anchor", "ad_pos", "intra_neg"), ("anchor", "pos", "ad_intra_neg")],
)
@pytest.mark.parametrize("beta,alpha", [(0.0, 1.5), (0.01, 1.5), (0.25, 2.0)])
def test_moquad_loss_matches_loop(names, beta, alpha):
    torch.manual_seed(0)
    z = torch.randn(5, len(names), 8, dtype=torch.float64)
    tau = 0.1
    got, g_got = _grad(lambda x: moquad_loss(x.float(), roles(names), tau=tau, hard_beta=beta, hard_alpha=alpha), z)
    want, g_want = _grad(lambda x: ref_quad(x, names, tau, beta, alpha, range(5))[0], z)
    assert abs(float(got) - float(want)) < 1e-5 * max(1.0, abs(float(want)))
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)
    _, stats = moquad_loss(z.float(), roles(names), tau=tau, hard_beta=beta, hard_alpha=alpha)
    _, r_pos, r_intra = ref_quad(z, names, tau, beta, alpha, range(5))
    assert stats["rank_pos"] == pytest.approx(r_pos)
    if len(names) > 2:
        assert stats["rank_intra_neg"] == pytest.approx(r_intra)
    else:
        assert math.isnan(stats["rank_intra_neg"])


def test_moquad_loss_global_batch_slice():
    """A rank's anchors against the gathered global batch equal the loop over those anchors."""
    torch.manual_seed(1)
    zg = torch.randn(6, 4, 8, dtype=torch.float64)
    loss, stats = moquad_loss(
        zg[2:4].float(), roles(QUAD), z_global=zg.float(), offset=2, tau=0.1, hard_beta=0.1, hard_alpha=1.5
    )
    want, r_pos, _ = ref_quad(zg, QUAD, 0.1, 0.1, 1.5, [2, 3])
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert stats["rank_pos"] == pytest.approx(r_pos)


def test_mining_off_cases_equal_eq1():
    torch.manual_seed(2)
    z = torch.randn(4, 4, 16)
    eq1, _ = moquad_loss(z, roles(QUAD), tau=0.1, hard_beta=0.0, hard_alpha=1.5)
    alpha1, _ = moquad_loss(z, roles(QUAD), tau=0.1, hard_beta=0.5, hard_alpha=1.0)
    mined, _ = moquad_loss(z, roles(QUAD), tau=0.1, hard_beta=0.5, hard_alpha=1.5)
    assert float(alpha1) == pytest.approx(float(eq1), rel=1e-6)
    assert float(mined) > float(eq1)  # up-weighting negatives can only raise the loss


def test_hard_k_rule():
    assert hard_k(1020, 0.01) == 10  # global batch 256: 255 * 4 inter negatives
    assert hard_k(12, 0.01) == 1  # never silently off on small batches
    assert hard_k(12, 0.0) == 0
    assert hard_k(12, 0.5) == 6


def ref_appearance(z, tau, videos=None):
    g = z.shape[0]
    videos = list(range(g)) if videos is None else videos
    zn = [[_unit(z[j, s]) for s in range(2)] for j in range(g)]
    total = 0.0
    for i in range(g):
        pos = torch.exp(_dot(zn[i][0], zn[i][1]) / tau)
        neg = sum(torch.exp(_dot(zn[i][0], zn[j][s]) / tau) for j in range(g) if videos[j] != videos[i] for s in range(2))
        total = total - torch.log(pos / (pos + neg))
    return total / g


def test_appearance_loss_matches_loop():
    torch.manual_seed(3)
    z = torch.randn(6, 2, 8, dtype=torch.float64)
    got, g_got = _grad(lambda x: appearance_loss(x.float(), tau=0.2), z)
    want, g_want = _grad(lambda x: ref_appearance(x, 0.2), z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)


def ref_nt_xent(z, tau, videos=None):
    g = z.shape[0]
    videos = list(range(g)) if videos is None else videos
    views = [_unit(z[j, s]) for s in range(2) for j in range(g)]  # index s*g + j
    total = 0.0
    for a in range(2 * g):
        p = (a + g) % (2 * g)
        pos = torch.exp(_dot(views[a], views[p]) / tau)
        denom = pos + sum(torch.exp(_dot(views[a], views[c]) / tau) for c in range(2 * g)
                          if videos[c % g] != videos[a % g])
        total = total - torch.log(pos / denom)
    return total / (2 * g)


def test_nt_xent_matches_loop_and_library():
    from pytorch_metric_learning.losses import NTXentLoss

    torch.manual_seed(4)
    z = torch.randn(6, 2, 8, dtype=torch.float64)
    got, g_got = _grad(lambda x: nt_xent_loss(x.float(), tau=0.1), z)
    want, g_want = _grad(lambda x: ref_nt_xent(x, 0.1), z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)
    emb = torch.cat([z[:, 0], z[:, 1]]).float()
    labels = torch.cat([torch.arange(6), torch.arange(6)])
    lib = NTXentLoss(temperature=0.1)(emb, labels)
    assert float(got) == pytest.approx(float(lib), rel=1e-5)


def test_nt_xent_global_slice():
    torch.manual_seed(5)
    zg = torch.randn(4, 2, 8)
    full, _ = nt_xent_loss(zg, tau=0.1)
    a, _ = nt_xent_loss(zg[:2], z_global=zg, offset=0, tau=0.1)
    b, _ = nt_xent_loss(zg[2:], z_global=zg, offset=2, tau=0.1)
    assert float((a + b) / 2) == pytest.approx(float(full), rel=1e-5)


def test_ranks_when_positive_is_nearest():
    z = torch.randn(3, 4, 8)
    z[:, 1] = z[:, 0]  # AD-Pos identical to the anchor -> rank 1
    _, stats = moquad_loss(z, roles(QUAD), tau=0.1, hard_beta=0.0, hard_alpha=1.5)
    assert stats["rank_pos"] == 1.0
    assert stats["rank_intra_neg"] >= 2.0


def test_role_views_and_errors():
    assert role_views(roles(QUAD)) == (1, [2, 3])
    assert role_views(("anchor", "positive")) == (1, [])
    with pytest.raises(ValueError, match="anchor"):
        role_views(("positive", "anchor"))
    with pytest.raises(ValueError, match="positive"):
        role_views(("anchor", "intra_negative"))
    with pytest.raises(ValueError, match="unknown roles"):
        role_views(("anchor", "positive", "intra_neg"))
    with pytest.raises(ValueError, match=r"\(B, 4, D\)"):
        moquad_loss(torch.randn(2, 3, 4), roles(QUAD), tau=0.1, hard_beta=0.0, hard_alpha=1.5)
    with pytest.raises(ValueError):
        nt_xent_loss(torch.randn(2, 4, 4), tau=0.1)


DUP = [0, 1, 2, 1, 3]  # manifest indices of a batch in which video 1 appears twice


@pytest.mark.parametrize("beta", [0.0, 0.25])
def test_same_video_is_never_an_inter_negative(beta):
    """A duplicated video's other copy is masked in Eq. 1 / Eq. 4, values and gradients against the loop."""
    torch.manual_seed(6)
    z = torch.randn(5, 4, 8, dtype=torch.float64)
    video = torch.tensor(DUP)
    got, g_got = _grad(lambda x: moquad_loss(x.float(), roles(QUAD), tau=0.1, hard_beta=beta, hard_alpha=1.5, video=video), z)
    want, g_want = _grad(lambda x: ref_quad(x, QUAD, 0.1, beta, 1.5, range(5), DUP)[0], z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)
    plain, _ = moquad_loss(z.float(), roles(QUAD), tau=0.1, hard_beta=beta, hard_alpha=1.5)
    assert float(plain) != pytest.approx(float(got), rel=1e-4)  # the mask changes the value
    # a rank's slice against the gathered batch masks the same way
    part, _ = moquad_loss(z[1:3].float(), roles(QUAD), z_global=z.float(), offset=1, tau=0.1, hard_beta=beta, hard_alpha=1.5,
                          video=video[1:3], video_global=video)
    want_part = ref_quad(z, QUAD, 0.1, beta, 1.5, [1, 2], DUP)[0]
    assert float(part) == pytest.approx(float(want_part), rel=1e-5)


def test_same_video_masked_in_eq3_and_nt_xent():
    torch.manual_seed(7)
    z = torch.randn(5, 2, 8, dtype=torch.float64)
    video = torch.tensor(DUP)
    got, g_got = _grad(lambda x: appearance_loss(x.float(), tau=0.2, video=video), z)
    want, g_want = _grad(lambda x: ref_appearance(x, 0.2, DUP), z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)
    got, g_got = _grad(lambda x: nt_xent_loss(x.float(), tau=0.1, video=video), z)
    want, g_want = _grad(lambda x: ref_nt_xent(x, 0.1, DUP), z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("names", [QUAD, ("anchor", "pos")])
def test_eq4_counts_each_anchors_unmasked_negatives(names):
    """Eq. 4's K on the SimCLR base (and MoQuad on it) is counted per anchor over its unmasked inter negatives:
    with video 1 twice in a batch of 5, its anchors mine floor(beta * 3 videos' views), the others floor(beta * 4
    videos' views) (values and gradients against the float64 loop, which counts K the same way per anchor)."""
    torch.manual_seed(8)
    z = torch.randn(5, len(names), 8, dtype=torch.float64)
    video, beta = torch.tensor(DUP), 0.25
    got, g_got = _grad(lambda x: moquad_loss(x.float(), roles(names), tau=0.1, hard_beta=beta, hard_alpha=2.0,
                                             video=video), z)
    want, g_want = _grad(lambda x: ref_quad(x, names, 0.1, beta, 2.0, range(5), DUP)[0], z)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)
