"""The op tables of moquad.data.ops: appearance (RAD-inter / RAD-intra / BE / none), motion (speed / reverse /
shuffle / periodic, one or several per anchor) and flip policies (independent / shared / none).

Videos from ``fixtures.coded_video`` have flat frames whose colour encodes (video, frame), so the tests read
from the loader's pixels which video and frame every value came from.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from video_fixtures import coded_dataset, coded_video, decode_code

from moquad.config import LoaderConfig
from moquad.data import ops
from moquad.data.augment import apply_views, to_model
from moquad.data.ops import FLIP_POLICIES, MOTION_OPS, rad_mosaic
from moquad.data.pipeline import make_loader
from moquad.data.views import draw_views

PLAIN = LoaderConfig(  # no spatial augmentation: frames 32x40 -> a 32x32 square, flat colours kept
    frames=8, size=32, crop_scale=(1.0, 1.0), flip="none", color_jitter=0.0, grayscale=0.0, workers=0,
)


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    return coded_dataset(tmp_path_factory.mktemp("coded"), num_videos=6, num_frames=48, videos_per_shard=2)


def _batches(data, cfg, n=3, batch_size=2, **kw):
    return list(make_loader(data, cfg, batch_size=batch_size, num_batches=n, **kw))


def _codes(clip: torch.Tensor) -> list[tuple[int, int]]:
    """(video, frame) of every frame of an undisturbed uint8 clip (3, T, H, W)."""
    return [decode_code(clip[:, t].float().mean(dim=(1, 2)).numpy()) for t in range(clip.shape[1])]


def _clean(video: int, indices) -> torch.Tensor:
    """Independent reference: the undisturbed clip (3, T) colours straight from the coded formula."""
    frames = coded_video(video, 48, 1, 1)[np.asarray(indices)][:, 0, 0]  # (T, 3)
    return torch.from_numpy(frames.T.astype(np.float64))


def test_rad_mosaic_windows_hold_the_donors():
    k = 5
    colours = torch.arange(k * k, dtype=torch.uint8) * 10
    cells = colours.view(-1, 1, 1, 1).expand(k * k, 7, 7, 3).contiguous()
    for size in (35, 32):  # k divides the mosaic / mosaic resized to a fractional window
        noise = rad_mosaic(cells[None], size)[0]  # (size, size, 3)
        centres = [int((i + 0.5) * size / k) for i in range(k)]
        got = noise[..., 0][centres][:, centres].float().round().flatten()
        assert got.tolist() == colours.float().tolist()  # row-major, one donor per window


def test_motion_ops_frame_orders():
    """Each op's frames against its definition, written out by hand."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        speed = MOTION_OPS["speed"].frames(40, 8, 4, rng)
        assert np.diff(speed).tolist() == [4] * 7 and 0 <= speed[0] and speed[-1] < 40
        rev = MOTION_OPS["reverse"].frames(40, 8, 2, rng)
        assert np.diff(rev).tolist() == [-2] * 7
        sh = MOTION_OPS["shuffle"].frames(40, 8, 2, rng)
        ordered = np.sort(sh)
        assert np.diff(ordered).tolist() == [2] * 7 and not np.array_equal(sh, ordered)
        per = MOTION_OPS["periodic"].frames(40, 8, 2, rng)  # 5 forward, 3 back over the same frames
        s0 = per[0]
        assert per.tolist() == [s0, s0 + 2, s0 + 4, s0 + 6, s0 + 8, s0 + 6, s0 + 4, s0 + 2]
    assert [n for n, op in MOTION_OPS.items() if op.second_speed] == ["speed"]


def test_flip_policies():
    rng = np.random.default_rng(0)
    draws = np.stack([FLIP_POLICIES["independent"](4, rng) for _ in range(400)])
    assert 0.4 < draws.mean() < 0.6 and (draws.min(1) != draws.max(1)).any()  # views differ within a video
    shared = np.stack([FLIP_POLICIES["shared"](4, rng) for _ in range(400)])
    assert 0.4 < shared.mean() < 0.6 and (shared.min(1) == shared.max(1)).all()  # one coin per video
    assert not np.stack([FLIP_POLICIES["none"](4, rng) for _ in range(50)]).any()


def test_several_motion_ops_make_their_own_negatives():
    cfg = dataclasses.replace(PLAIN, motion_ops=("speed", "reverse", "periodic"), dilations=(1, 4), flip="shared")
    p = draw_views(48, (32, 40), cfg, np.random.default_rng(3), pick=lambda k, rng: (np.zeros(k, int), ["x"] * k))
    assert p.names == ("anchor", "ad_pos", "intra_neg", "ad_intra_neg", "intra_neg:reverse", "ad_intra_neg:reverse",
                       "intra_neg:periodic", "ad_intra_neg:periodic")
    idx = p.info["indices"]
    n, m = p.info["dilations"]
    assert {n, m} == {1, 4}
    assert set(np.diff(idx[2])) == {m} and set(np.diff(idx[4])) == {-n} and set(np.diff(idx[5])) == {-n}
    assert np.diff(idx[6])[:4].tolist() == [n] * 4 and np.diff(idx[6])[4:].tolist() == [-n] * 3
    assert p.lam[[1, 3, 5, 7]].min() > 0 and p.lam[[0, 2, 4, 6]].max() == 0
    assert len(set(p.flip.tolist())) == 1  # shared: the whole sextuple flipped together


def test_losses_read_every_negative():
    from moquad.data.views import quadruple
    from moquad.train.losses import role_views

    plan = quadruple(LoaderConfig(motion_ops=("speed", "reverse")))
    assert plan.names == ("anchor", "ad_pos", "intra_neg", "ad_intra_neg", "intra_neg:reverse", "ad_intra_neg:reverse")
    assert role_views(plan.roles) == (1, [2, 3, 4, 5])


def test_rad_residual_is_the_same_image_on_every_frame(coded):
    """P-bar - (1 - lam) * P is lam * D on every frame; D's windows come from OTHER videos."""
    cfg = dataclasses.replace(PLAIN, rad_lambda=(0.4, 0.5))
    seen_donors = 0
    for batch in _batches(coded, cfg, n=3):
        names = batch["view_names"]
        for b, info in enumerate(batch["info"]):
            video = int(batch["video_id"][b][1:])
            for v in (names.index("ad_pos"), names.index("ad_intra_neg")):
                lam = float(batch["lam"][b, v])
                assert 0.4 <= lam <= 0.5
                clip = batch["views"][b, v].double()  # (3, T, H, W)
                clean = _clean(video, info["indices"][v])  # (3, T)
                residual = clip - (1 - lam) * clean[:, :, None, None]
                assert (residual - residual[:, :1]).abs().max() <= 2.5  # same image (JPEG +-1, one rounding)
                noise = residual[:, 0] / lam
                centres = [int((i + 0.5) * 32 / 5) for i in range(5)]
                donors = [decode_code(noise[:, y, x].numpy())[0] for y in centres for x in centres]
                assert video not in donors  # never from the sample's own video
                assert [f"v{d:02d}" for d in donors] == info["donor_ids"][v]
                seen_donors += len(set(donors))
    assert seen_donors > 12  # donors really vary


def test_plain_views_and_lambda_zero(coded):
    batch = _batches(coded, PLAIN, n=1)[0]
    for b, info in enumerate(batch["info"]):
        video = int(batch["video_id"][b][1:])
        for v, name in enumerate(batch["view_names"]):
            if name in ("anchor", "intra_neg"):
                assert batch["lam"][b, v] == 0
                got = _codes(batch["views"][b, v])
                assert got == [(video, int(i)) for i in info["indices"][v]]


def test_intra_negatives_have_the_other_dilation(coded):
    for batch in _batches(coded, PLAIN, n=3):
        for b, info in enumerate(batch["info"]):
            n, m = info["dilations"]
            assert n != m and {n, m} <= {1, 2, 4}
            steps = {}
            for v, name in enumerate(batch["view_names"]):
                if name in ("anchor", "intra_neg"):  # read the frame numbers from the pixels
                    frames = [f for _, f in _codes(batch["views"][b, v])]
                    steps[name] = set(np.diff(frames).tolist())
                else:
                    steps[name] = set(np.diff(np.asarray(info["indices"][v])).tolist())
            assert steps["anchor"] == {n} and steps["ad_pos"] == {n}
            assert steps["intra_neg"] == {m} and steps["ad_intra_neg"] == {m}


@pytest.mark.parametrize("op", ["reverse", "shuffle"])
def test_reverse_and_shuffle_negatives_from_pixels(coded, op):
    cfg = dataclasses.replace(PLAIN, motion_ops=(op,))
    for batch in _batches(coded, cfg, n=2):
        for b in range(len(batch["video_id"])):
            anchor = [f for _, f in _codes(batch["views"][b, 0])]
            neg = [f for _, f in _codes(batch["views"][b, 2])]
            d = anchor[1] - anchor[0]
            assert d > 0 and set(np.diff(anchor).tolist()) == {d}
            ordered = sorted(neg)
            assert set(np.diff(ordered).tolist()) == {d}  # same speed, same kind of clip ...
            assert neg != ordered  # ... but not in playing order
            if op == "reverse":
                assert neg == ordered[::-1]


def test_appearance_op_none_leaves_clips_plain(coded):
    for batch in _batches(coded, dataclasses.replace(PLAIN, appearance_op="none"), n=1):
        assert batch["view_names"] == ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")
        assert torch.all(batch["lam"] == 0)
        for b, vid in enumerate(batch["video_id"]):
            for v in range(4):
                assert {c for c, _ in _codes(batch["views"][b, v])} == {int(vid[1:])}


# ---------------------------------------------------------------- float path, with augmentation


@pytest.mark.parametrize("op", ["rad_inter", "rad_intra", "be"])
def test_float_rad_residual_is_the_same_image_on_every_frame(coded, op):
    """With crops, flips and colour jitter on: P-bar - (1 - lam) * P (P: the same parameters with lam = 0) is
    the same image on every frame, lam * D, D the mosaic of the view's donor windows (BE: a frame of the
    augmented clip); RAD-inter's windows are never from the sample's own video."""
    cfg = dataclasses.replace(PLAIN, appearance_op=op, rad_lambda=(0.3, 0.5), crop_scale=(0.3, 1.0), flip="independent",
                              color_jitter=1.0, grayscale=0.3)
    batch = next(iter(make_loader(coded, dataclasses.replace(cfg, augment_on_device=True), batch_size=3, num_batches=1)))
    out = apply_views(batch, cfg.size).double().permute(0, 1, 5, 2, 3, 4)  # (B, V, 3, T, S, S)
    clean = apply_views({**batch, "lam": torch.zeros_like(batch["lam"])}, cfg.size).double().permute(0, 1, 5, 2, 3, 4)
    checked = 0
    for b, info in enumerate(batch["info"]):
        video = batch["video_id"][b]
        for v, name in enumerate(batch["view_names"]):
            lam = float(batch["lam"][b, v])
            if not name.startswith("ad_"):
                assert lam == 0 and torch.equal(out[b, v], clean[b, v])
                continue
            residual = out[b, v] - (1 - lam) * clean[b, v]  # (3, T, H, W)
            assert (residual - residual[:, :1]).abs().max() < 1e-3  # identical on every frame
            if op == "be":
                j = int(batch["noise_frame"][b, v])
                assert torch.allclose(residual[:, 0], lam * clean[b, v, :, j], atol=1e-3)
                assert info["donor_ids"][v] == [video]
            else:
                k = cfg.rad_k
                d = rad_mosaic(batch["pool"][batch["cells"][b, v]][None], cfg.size)[0].permute(2, 0, 1).double()
                assert (residual[:, 0] - lam * d).abs().max() <= 1e-3
                centres = [int((i + 0.5) * cfg.size / k) for i in range(k)]
                donors = [f"v{decode_code(d[:, y, x].numpy())[0]:02d}" for y in centres for x in centres]
                assert donors == info["donor_ids"][v]
                assert (video in donors) == (op == "rad_intra")  # RAD-inter: never the sample's own video
            checked += 1
    assert checked == 6


# ---------------------------------------------------------------- a new appearance op: one table entry


def _draw_tint(ctx, rng):
    return ops.Disturbed(float(rng.uniform(*ctx["rad_lambda"])), {"tint": rng.uniform(0, 255, 3)}, (ctx["video_id"],))


def _noise_tint(batch, i, x, offset, cache):
    return batch["tint"].reshape(-1, 3)[i].to(x.device).expand(x.shape[1], x.shape[2], 3)


def test_a_new_appearance_op_with_its_own_parameter_is_one_table_entry(coded, monkeypatch):
    """``tint`` (D: a flat colour of its own per view) declares its parameter in its row and nothing else: the
    loader's parameters, both paths' batches, to_model and apply_views carry it by name."""
    tint = ops.AppearanceOp("a flat colour per view", "", _draw_tint, _noise_tint,
                            {"tint": ops.OpParam((3,), "float32", 0)})
    monkeypatch.setitem(ops.APPEARANCE_OPS, "tint", tint)  # the only change
    cfg = dataclasses.replace(PLAIN, appearance_op="tint", rad_lambda=(0.2, 0.5), color_jitter=1.0)
    raw = next(iter(make_loader(coded, dataclasses.replace(cfg, augment_on_device=True), batch_size=2, num_batches=1)))
    views = next(iter(make_loader(coded, cfg, batch_size=2, num_batches=1)))["views"]  # (B, V, 3, T, S, S) uint8
    assert raw["tint"].shape == (2, 4, 3) and raw["tint"].dtype == torch.float32 and "cells" not in raw
    out = apply_views(raw, cfg.size).double()  # (B, V, T, S, S, 3)
    clean = apply_views({**raw, "lam": torch.zeros_like(raw["lam"])}, cfg.size).double()
    for b in range(2):
        for v, name in enumerate(raw["view_names"]):
            lam, colour = float(raw["lam"][b, v]), raw["tint"][b, v].double()
            if not name.startswith("ad_"):
                assert lam == 0 and bool((colour == 0).all()) and torch.equal(out[b, v], clean[b, v])
                continue
            assert 0.2 <= lam <= 0.5 and bool((colour > 0).all())
            assert raw["info"][b]["donor_ids"][v] == [raw["video_id"][b]]
            assert (out[b, v] - ((1 - lam) * clean[b, v] + lam * colour)).abs().max() < 1e-3
    assert (views.permute(0, 1, 3, 4, 5, 2).double() - out).abs().max() <= 0.51  # the workers' uint8 views
    model_in = to_model(raw, "cpu", cfg.size)  # the device path reads the op's parameters too
    assert torch.allclose(model_in, to_model({"views": views}, "cpu", cfg.size), atol=0.51 / 255 / 0.21)


@pytest.mark.parametrize("name", ["box", "lam", "index", "label", "raw"])
def test_an_op_parameter_named_like_a_batch_key_is_refused(name):
    """An op's own parameter called like a batch key would silently overwrite it: one clear error naming it."""
    with pytest.raises(ValueError, match=rf"appearance op parameter '{name}' is named like a batch key"):
        ops.AppearanceOp("clash", "", _draw_tint, _noise_tint, {name: ops.OpParam((3,), "float32", 0)})


@pytest.mark.parametrize("device_side", [False, True])
def test_batch_keys_are_the_loaders(coded, device_side):
    """ops.BATCH_KEYS is what a batch holds besides the op's own parameters (so the refusal above is complete)."""
    for op in ("rad_inter", "be"):
        cfg = dataclasses.replace(PLAIN, appearance_op=op, augment_on_device=device_side)
        batch = _batches(coded, cfg, n=1)[0]
        assert set(batch) - set(ops.APPEARANCE_OPS[op].params) <= ops.BATCH_KEYS
        if device_side:  # the op's parameters travel in the batch under their own names
            assert set(ops.APPEARANCE_OPS[op].params) <= set(batch)
