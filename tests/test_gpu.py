"""The accelerator paths, on a real CUDA device (``pytest -m gpu``; every test is skipped without CUDA).

Tolerances are stated with each check: bf16 keeps 8 bits of mantissa (relative error ~4e-3 per value), so
losses computed from bf16 projections agree with fp32 to ~1e-2 relative; CUDA and CPU float kernels differ
in summation order only (~1e-4 of 255 levels), and the CPU worker path's uint8 resize and rounding add at
most 0.5 + 0.5 levels.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from video_fixtures import coded_dataset, write_dataset

from moquad.config import LoaderConfig, PretrainConfig
from moquad.data.augment import apply_views, to_model
from moquad.data.pipeline import make_loader
from moquad.models import build_model
from moquad.train.losses import moquad_loss, nt_xent_loss

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
QUAD = ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")
HEAD = (PretrainConfig().proj_dim, PretrainConfig().proj_hidden)  # the default projection head


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return coded_dataset(tmp_path_factory.mktemp("gpu"), num_videos=16, num_frames=40, videos_per_shard=4)


def test_bf16_autocast_losses_match_fp32():
    """Projections of a real network under bf16 autocast vs fp32: MoQuad (with mining) and NT-Xent within 2%."""
    torch.manual_seed(0)
    model = build_model("r3d_18", *HEAD).to(CUDA).eval()
    x = torch.randn(8 * 4, 3, 8, 64, 64, device=CUDA)
    with torch.no_grad():
        z32 = model(x).float().view(8, 4, -1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            z16 = model(x).float().view(8, 4, -1)
    for fn in (lambda z: moquad_loss(z, QUAD, tau=0.1, hard_beta=0.1, hard_alpha=1.5)[0],
               lambda z: nt_xent_loss(z[:, :2], tau=0.1)[0]):
        a, b = float(fn(z32)), float(fn(z16))
        assert abs(a - b) <= 2e-2 * abs(a), (a, b)
    assert float((z16 - z32).norm() / z32.norm()) < 2e-2


def test_apply_views_on_cuda_matches_the_cpu_worker_path(data):
    """Same ViewParams: the CUDA float path against the workers' uint8 views: max <= 1.01 levels, mean < 0.3."""
    cfg = LoaderConfig(frames=8, size=32, workers=0, color_jitter=0.8, grayscale=0.2)
    for changes in ({}, {"appearance_op": "be"}, {"appearance_op": "rad_intra"}):
        c = dataclasses.replace(cfg, **changes)
        cpu = next(iter(make_loader(data, c, batch_size=4)))
        raw = next(iter(make_loader(data, dataclasses.replace(c, augment_on_device=True), batch_size=4)))
        dev = apply_views({**raw, "raw": raw["raw"].to(CUDA)}, c.size).cpu()  # (B, V, T, S, S, 3) float
        ref = cpu["views"].permute(0, 1, 3, 4, 5, 2).float()
        diff = (dev - ref).abs()
        assert float(diff.max()) <= 1.01 and float(diff.mean()) < 0.3, (changes, float(diff.max()), float(diff.mean()))


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """Smooth textured frames (sines per channel) of two sizes: unlike flat patches, every resize rounds."""
    def video(frames, h, w, seed):
        yy, xx = np.mgrid[0:h, 0:w]
        return np.stack([np.stack([127 + 100 * np.sin(xx / (4 + c) + yy / (6 + 2 * c) + 0.4 * t + seed)
                                   for c in range(3)], -1) for t in range(frames)]).astype(np.uint8)

    videos = [(f"v{i:02d}", video(24, *((40, 56) if i % 2 else (48, 44)), i), i % 4) for i in range(8)]
    return write_dataset(tmp_path_factory.mktemp("tex"), videos, videos_per_shard=2)


def test_apply_views_on_cuda_matches_the_cpu_worker_path_on_textured_frames(textured):
    """The same on textured frames, the default colour strength: the CPU path rounds its resize to uint8 and the
    colour map then scales that rounding by its gain (up to ~2.7 at strength 0.5), CUDA stays float: stated bound
    3.5 levels, mean < 0.5. The figures are printed for the README (run with -s)."""
    cfg = LoaderConfig(frames=8, size=32, workers=0)
    for changes in ({}, {"appearance_op": "be"}, {"appearance_op": "rad_intra"}):
        c = dataclasses.replace(cfg, **changes)
        cpu = next(iter(make_loader(textured, c, batch_size=4)))
        raw = next(iter(make_loader(textured, dataclasses.replace(c, augment_on_device=True), batch_size=4)))
        dev = apply_views({**raw, "raw": raw["raw"].to(CUDA)}, c.size).cpu()
        diff = (dev - cpu["views"].permute(0, 1, 3, 4, 5, 2).float()).abs()
        print(f"textured {changes or 'rad_inter'}: max {float(diff.max()):.2f} mean {float(diff.mean()):.3f} levels")
        assert float(diff.max()) <= 3.5 and float(diff.mean()) < 0.5, (changes, float(diff.max()), float(diff.mean()))


@pytest.mark.parametrize("augment_on_device", [False, True])
def test_pinned_batches_from_recycled_worker_buffers_are_the_batches(data, augment_on_device):
    """pin_memory=True turns on BufferRing (each worker reuses its shared buffers every PREFETCH + 1 batches): the
    pinned batches, all KEPT to the end, equal a single process's, over 3 epochs of a run loader with 2 workers."""
    from moquad.data.pipeline import RunLoader

    base = LoaderConfig(frames=8, size=32, workers=0, augment_on_device=augment_on_device)
    cfg = dataclasses.replace(base, workers=2)
    run = RunLoader(data, cfg, batch_size=2, pin_memory=True)
    assert run.recycle
    key = "raw" if augment_on_device else "views"
    for epoch in range(3):
        got = list(make_loader(run, cfg, batch_size=2, epoch=epoch, pin_memory=True))
        ref = list(make_loader(data, base, batch_size=2, epoch=epoch))
        assert len(got) == len(ref) == 8 and all(b[key].is_pinned() for b in got)
        for b, r in zip(got, ref):
            if augment_on_device:  # what is read: the views made from the frames (the padding is never read)
                assert torch.equal(to_model(b, CUDA, 32), to_model(r, CUDA, 32))
            else:
                assert torch.equal(b["views"], r["views"])
    run.close()


def test_gpu_jpeg_decode_matches_the_cpu_decoder(data):
    """nvJPEG (decode_on_device) against libjpeg-turbo in the workers: IDCTs differ, means within 1 level."""
    cfg = LoaderConfig(frames=8, size=32, workers=0)
    a = next(iter(make_loader(data, dataclasses.replace(cfg, augment_on_device=True), batch_size=4)))
    b = next(iter(make_loader(data, dataclasses.replace(cfg, decode_on_device=True), batch_size=4)))
    x, y = to_model(a, CUDA, 32), to_model(b, CUDA, 32)
    levels = (x - y).abs() * 0.225 * 255
    assert float(levels.mean()) < 1.0 and float(levels.max()) < 12


@pytest.mark.parametrize("channels_last", [False, True])
def test_r3d18_training_step_in_bf16(channels_last):
    from moquad.train.loop import forward_loss
    from moquad.train.optimizers import make_optimizer

    torch.manual_seed(0)
    model = build_model("r3d_18", *HEAD).to(CUDA).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    opt = make_optimizer(model, "lars", 0.1, 1e-6)
    views = torch.randn(8, 4, 3, 16, 112, 112, device=CUDA)
    before = [p.detach().clone() for p in model.parameters()]
    loss, stats = forward_loss(model, views, ("anchor", "positive", "intra_negative", "intra_negative"), "moquad.train.losses:quadruple", tau=0.1, hard_beta=0.01, hard_alpha=1.5, video=torch.arange(8, device=CUDA))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and 0 < float(loss) < 20
    assert 1 <= float(stats["rank_pos"]) <= 32
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert moved == len(before)  # every parameter was updated


def test_checkpoint_saved_on_cuda_loads_on_cpu(tmp_path):
    from moquad.train import checkpoint

    model = build_model("tiny", *HEAD).to(CUDA)
    path = checkpoint.save({"model": model.state_dict(), "step": 1, "epoch": 0,
                            "config": {"backbone": "tiny", "proj_dim": 128, "proj_hidden": 2048}}, tmp_path / "c.pt")
    loaded, ckpt = checkpoint.load_model(path)
    assert all(v.device.type == "cpu" for v in ckpt["model"].values())
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt["model"][k], v.cpu())
    assert next(loaded.parameters()).device.type == "cpu"


SYNC_BN = """
import os, torch, torch.distributed as dist
from torch import nn
from moquad.config import PretrainConfig
from moquad.models import build_model
HEAD = (PretrainConfig().proj_dim, PretrainConfig().proj_hidden)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
torch.manual_seed(0)
plain = build_model("r3d_18", *HEAD).cuda().train()
synced = nn.SyncBatchNorm.convert_sync_batchnorm(build_model("r3d_18", *HEAD)).cuda().train()
synced.load_state_dict(plain.state_dict())
n_sync = sum(isinstance(m, nn.SyncBatchNorm) for m in synced.modules())
assert n_sync > 0 and not any(isinstance(m, nn.BatchNorm3d) and not isinstance(m, nn.SyncBatchNorm) for m in synced.modules())
x = torch.randn(4, 3, 8, 64, 64, device="cuda")
a, b = plain(x), nn.parallel.DistributedDataParallel(synced, device_ids=[0])(x)
b.sum().backward()
assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), float((a - b).abs().max())
print("SYNCBN_OK", n_sync)
dist.destroy_process_group()
"""


def _torchrun(args: list[str], tmp_path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=os.getcwd())


def test_sync_batchnorm_conversion_under_nccl(tmp_path):
    script = tmp_path / "syncbn.py"
    script.write_text(SYNC_BN)
    out = _torchrun([str(script)], tmp_path)
    assert out.returncode == 0 and "SYNCBN_OK" in out.stdout, out.stderr[-3000:]


def test_ddp_pretrain_under_torchrun_with_nccl(data, tmp_path):
    """The CLI's pretrain under torchrun (1 process, NCCL), augment on device, sync BN on: a finite loss curve."""
    run = tmp_path / "run"
    out = _torchrun(["-m", "moquad.cli", "pretrain", "--data", str(data), "--out", str(run), "--backbone", "r3d_18",
                     "--epochs", "2", "--batch-size", "4", "--frames", "8", "--size", "64", "--workers", "2",
                     "--warmup-ratio", "0.5", "--device", "cuda", "--augment-on-device", "--sync-bn"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert len(recs) == 8 and all(r["loss"] > 0 for r in recs)
    assert [r["mode"] for r in recs] == ["appearance"] * 4 + ["moquad"] * 4
    assert (run / "checkpoints" / "last.pt").is_file()
