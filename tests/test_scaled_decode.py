"""Reduced-size decoding (``LoaderConfig.scaled_decode``): which frames are decoded at 1/2, 1/4 or 1/8, and how
close the clips stay to full decode + resize, on real K400-like frames (340x256, JPEG quality 90)."""

from __future__ import annotations

import dataclasses
import math

import av
import numpy as np
import pytest
import simplejpeg
import torch
from video_fixtures import write_dataset

from moquad.config import LoaderConfig
from moquad.data.augment import apply_views
from moquad.data.donors import donor_pool, resize_cells
from moquad.data.pipeline import _own_cells, make_loader
from moquad.data.store import Split, decode_jpeg, reduced_hw
from moquad.data.views import draw_views, fixed_pair, reduce_views, reduced_box

CLIPS = ("R6llTwEh07w.mp4", "SOX5yA1l24A.mp4", "WUzgd7C1pWA.mp4", "test.mp4")
# a view's frames and boxes only (no colour, no appearance disturbance): the views are crop + resize + flip
PLAIN = LoaderConfig(frames=8, size=112, dilations=(1, 2), color_jitter=0.0, grayscale=0.0, workers=0)


def _frames(path, count: int) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for _, f in zip(range(count), container.decode(video=0))])


@pytest.fixture(scope="module")
def real256(real_videos_dir, tmp_path_factory):
    """4 real K400-like clips (340x256: short side 256), 24 frames each, as preprocessing stores them (q 90)."""
    videos = [(f"v{i}", _frames(real_videos_dir / name, 24), i % 2) for i, name in enumerate(CLIPS)]
    assert all(v.shape[1:] == (256, 340, 3) for _, v, _ in videos)
    return write_dataset(tmp_path_factory.mktemp("real256"), videos, videos_per_shard=2, quality=90)


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def test_reduced_sizes_round_up_like_libjpeg(real_videos_dir):
    frame = np.ascontiguousarray(_frames(real_videos_dir / CLIPS[0], 1)[0, :255, :339])  # odd sizes
    data = simplejpeg.encode_jpeg(frame, quality=90)
    for r, hw in ((1, (255, 339)), (2, (128, 170)), (4, (64, 85)), (8, (32, 43))):
        assert reduced_hw((255, 339), r) == hw
        assert decode_jpeg(data, reduce=r).shape == (*hw, 3) == decode_jpeg(data, reduce=r, hw=(255, 339)).shape


def test_the_largest_reduction_that_covers_the_output_shared_frames_take_the_smallest():
    cfg = dataclasses.replace(PLAIN, frames=4, rad_k=1)
    p = draw_views(48, (512, 680), cfg, np.random.default_rng(0), views=fixed_pair(cfg))
    p.frames, p.appearance_op, p.op_params = np.arange(15), "rad_intra", {"cells": np.full((4, 1), -1)}
    p.frame_index = np.array([[0, 1, 2, 3], [3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]])
    p.box = np.array([[1, 0, 224, 230], [0, 0, 150, 150], [10, 10, 460, 460], [0, 3, 300, 300]])
    reduce, boxes = reduce_views(p, (512, 680), 112)
    # view 0 alone would be 1/2 (224 px -> 112) but shares frame 3 with view 1 (150 px: no reduction)
    assert reduce.tolist() == [1] * 7 + [4] * 4 + [2] * 4
    assert boxes.tolist() == [[1, 0, 224, 230], [0, 0, 150, 150], [3, 3, 115, 115], [0, 2, 150, 150]]
    assert reduced_box(np.array([0, 0, 222, 300]), 2, (512, 680))[2] == 111  # < 112: not reducible
    p.op_params["cells"][2, 0] = 7  # a RAD-intra window of 200 px from frame 7: 1/4 (128 px) would not cover it
    assert reduce_views(p, (512, 680), 112, cell=200)[0].tolist() == [1] * 7 + [2] * 8


def test_scaled_clips_stay_close_to_full_decode_and_resize(real256):
    """Same parameters with and without scaled_decode. A view decoded at 1/2 against full decode + resize of the
    same box (its edges on even source pixels, where the reduced frame's pixels start): PSNR >= 36 dB (measured
    over 13 views: 37.9 dB lowest, 42.2 median). Against the box as drawn (edges up to 1 source pixel away, half
    an output pixel): >= 25 dB (measured 26.0 lowest, 33.8 median): a shift of the random crop, not a loss of
    detail. Views that no reduction fits are bit for bit those of the full decode."""
    cfg = dataclasses.replace(PLAIN, crop_scale=(0.6, 1.0), augment_on_device=True)
    same, near, drawn = 0, [], []
    for epoch in range(2):
        full = list(make_loader(real256, dataclasses.replace(cfg, scaled_decode=False), batch_size=2, epoch=epoch,
                                views=fixed_pair(cfg)))
        for fb, sb in zip(full, make_loader(real256, cfg, batch_size=2, epoch=epoch, views=fixed_pair(cfg))):
            smallest = min(int(i["reduce"].min()) for i in sb["info"])  # raw: padded to the largest decoded frame
            assert sb["raw"].shape[2:4] == reduced_hw((256, 340), smallest) and fb["raw"].shape[2:4] == (256, 340)
            scaled, plain = apply_views(sb, cfg.size, quantize=True), apply_views(fb, cfg.size, quantize=True)
            for b, info in enumerate(sb["info"]):
                for v in range(len(sb["view_names"])):
                    r = int(info["reduce"][sb["frame_index"][b, v, 0]])
                    assert set(info["reduce"][sb["frame_index"][b, v]].tolist()) == {r}
                    assert r == 1 or min(fb["box"][b, v, 2:].tolist()) >= 2 * cfg.size - 1  # < 2x the output: 1/1
                    if r == 1:
                        assert torch.equal(scaled[b, v], plain[b, v]) and torch.equal(sb["box"][b, v], fb["box"][b, v])
                        same += 1
                        continue
                    assert r == 2  # 256-px frames: a box of >= 223 px (112 at 1/2), never 448 (1/4)
                    edges = {**fb, "box": fb["box"].clone()}
                    edges["box"][b, v] = sb["box"][b, v] * r  # the same box in source pixels
                    near.append(_psnr(scaled[b, v], apply_views(edges, cfg.size, quantize=True)[b, v]))
                    drawn.append(_psnr(scaled[b, v], plain[b, v]))
    assert same >= 3 and len(near) >= 3
    assert min(near) >= 36 and min(drawn) >= 25, (sorted(near), sorted(drawn))


def test_rad_intra_windows_of_reduced_frames(real256):
    """RAD-intra reads its windows from the videos' decoded frames (here one video at 1/2, one full size): the same
    windows (PSNR >= 45 dB against those of full-size frames at 23 px; measured 59 dB)."""
    cfg = dataclasses.replace(PLAIN, appearance_op="rad_intra", crop_scale=(0.6, 1.0), augment_on_device=True)
    full = next(iter(make_loader(real256, dataclasses.replace(cfg, scaled_decode=False), batch_size=2)))
    scaled = next(iter(make_loader(real256, cfg, batch_size=2)))
    assert sorted(int(i["reduce"].max()) for i in scaled["info"]) == [1, 2]
    assert torch.equal(scaled["cells"], full["cells"]) and scaled["pool"].shape == full["pool"].shape
    assert _psnr(scaled["pool"], full["pool"]) >= 45


def test_own_cells_of_frames_at_two_scales():
    raw = torch.zeros((2, 8, 10, 3), dtype=torch.uint8)
    raw[0] = torch.randint(0, 256, (8, 10, 3), dtype=torch.uint8)  # full size
    raw[1, :4, :5] = torch.randint(0, 256, (4, 5, 3), dtype=torch.uint8)  # at 1/2, zero padded
    got = _own_cells(raw, np.array([1, 0, 1]), np.array([1, 2]), (8, 10), 3)
    assert torch.equal(got[0], resize_cells(raw[1:2, :4, :5].contiguous(), 3)[0]) and torch.equal(got[0], got[2])
    assert torch.equal(got[1], resize_cells(raw[0:1], 3)[0])


def test_donor_frames_decoded_small(real256):
    """RAD-inter donor frames go into 23 px windows: decoded at 1/4 (64x85: twice the window) they give the same
    windows (PSNR >= 45 dB against full-size decoding; measured 50.7 dB on 20 frames of these clips, where 1/8,
    the 8x8 block means, gives 33 dB)."""
    split = Split(real256, "train")
    picks = [(i, 5 * i) for i in range(len(split))]
    full, small = donor_pool(split, picks, 23), donor_pool(split, picks, 23, scaled=True)
    assert small.cells.shape == full.cells.shape == (4, 23, 23, 3) and small.ids == full.ids
    assert _psnr(small.cells, full.cells) >= 45
