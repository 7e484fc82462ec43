"""Feature extraction: clip geometry, 1-rank vs 2-rank equality (real gloo group), cache reuse.

``make_tiny_dataset`` / ``make_checkpoint`` build a data folder (with the product's shard writer) and a
checkpoint without the preprocess / train stages; the other eval tests import them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cli_child as clirun
import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import simplejpeg
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import webdataset as wds
from s3server import free_port
from video_fixtures import make_checkpoint, write_dataset

from moquad import dist as moquad_dist
from moquad.config import ConfigError, EvalConfig
from moquad.data.augment import normalize
from moquad.data.clip_frames import uniform_clips
from moquad.data.store import Split
from moquad.errors import MoquadError
from moquad.eval.clips import spatial_crops
from moquad.eval.features import compute_features, extract, read_features
from moquad.train.checkpoint import load_model

CLASSES = ["Red", "Green", "Blue"]
COLOURS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200]])


def _video(rng: np.random.Generator, label: int, frames: int, h: int, w: int) -> np.ndarray:
    """Class-coloured background with a bright square moving right -> uint8 (T, H, W, 3)."""
    base = COLOURS[label] + rng.integers(-30, 31, 3)
    out = np.clip(base + rng.integers(-25, 26, (frames, h, w, 3)), 0, 255).astype(np.uint8)
    for t in range(frames):
        x = (t * 2) % max(1, w - 8)
        out[t, h // 3 : h // 3 + 8, x : x + 8] = 255
    return out


def make_tiny_dataset(root: Path, per_split: dict[str, int] | None = None, frames: int = 12, seed: int = 0) -> Path:
    """A data folder written by the product's shard writer (``fixtures.write_dataset``), 2 shards per split.

    Video i has ``frames - (i % 3) * 3`` frames (keep ``frames`` > 6): some are shorter than a clip span."""
    if frames <= 6:
        raise ValueError("frames must be > 6")
    rng = np.random.default_rng(seed)
    for split, n in (per_split or {"train": 9, "test": 6}).items():
        videos = []
        for i in range(n):
            label = i % len(CLASSES)
            h, w = (40, 32) if i % 4 == 3 else (32, 44)  # some portrait videos
            videos.append((f"{split}/v_{CLASSES[label]}_{i:02d}.avi", _video(rng, label, frames - (i % 3) * 3, h, w), label))
        write_dataset(root, videos, split=split, videos_per_shard=(n + 1) // 2, quality=90, fps=25.0, classes=CLASSES)
    return root


def eval_cfg(data: Path, ckpt: Path, out: Path, **kw) -> EvalConfig:
    base = dict(data=str(data), checkpoint=str(ckpt), out=str(out) if out else None, num_clips=2, frames=4, dilation=2, size=32,
                crops=1, batch_size=8, workers=0, ks=(1, 5), device="cpu", linear={"epochs": 3},
                finetune={"epochs": 3})
    base.update(kw)
    return EvalConfig(**base)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("evaldata")
    return make_tiny_dataset(root / "data"), make_checkpoint(root / "run" / "checkpoints" / "last.pt")


def test_clip_indices_uniform_and_short_videos():
    # 20 frames, 4-frame clips at dilation 2 (span 7): starts 0..13 spread over 3 clips
    np.testing.assert_array_equal(uniform_clips(20, 4, 2, 3), [[0, 2, 4, 6], [6, 8, 10, 12], [13, 15, 17, 19]])
    np.testing.assert_array_equal(uniform_clips(20, 4, 2, 1), [[6, 8, 10, 12]])  # one clip is centred
    np.testing.assert_array_equal(uniform_clips(5, 4, 2, 2), [[0, 1, 3, 4], [0, 1, 3, 4]])  # stretched, as in training


def test_three_crops_cover_the_long_side():
    x = torch.arange(2 * 16 * 48 * 3, dtype=torch.float32).reshape(2, 16, 48, 3).remainder(251).to(torch.uint8)
    c = spatial_crops(x, 16, 3)  # no resize needed: short side is already 16
    assert c.shape == (3, 3, 2, 16, 16)
    ref = x.permute(3, 0, 1, 2)
    for k, x0 in enumerate((0, 16, 32)):
        torch.testing.assert_close(c[k], ref[:, :, :, x0 : x0 + 16])
    centre = spatial_crops(x.transpose(1, 2), 16, 1)  # portrait: centre crop along H
    torch.testing.assert_close(centre[0], x.transpose(1, 2).permute(3, 0, 1, 2)[:, :, 16:32, :])


def test_extract_table_and_reference_feature(tiny, tmp_path):
    data, ckpt = tiny
    cfg = eval_cfg(data, ckpt, tmp_path, crops=3)
    path = extract(cfg, "test")
    f = read_features(path)
    man = pq.read_table(data / "manifests" / "test.parquet")
    assert f["video_id"] == man.column("video_id").to_pylist()
    assert f["embedding"].shape == (6, 64) and f["embedding"].dtype == np.float32
    np.testing.assert_array_equal(f["label"], man.column("label").to_numpy())
    assert lance.dataset(str(path)).schema.field("embedding").type == pa.list_(pa.float32(), 64)
    assert f["metadata"]["protocol"]["crops"] == 3 and len(f["metadata"]["checkpoint_sha256"]) == 64
    # independent reference for one video: decode the tar sample with webdataset, mean of per-view features
    model, _ = load_model(ckpt)
    model.eval()
    row = man.slice(1, 1).to_pylist()[0]
    sample = next(s for s in wds.WebDataset(str(data / row["shard"]), shardshuffle=False)
                  if json.loads(s["json"])["video_id"] == row["video_id"])
    fo = row["frame_offsets"]
    frames = [simplejpeg.decode_jpeg(sample["jpgs"][fo[i] : fo[i + 1]]) for i in range(row["num_frames"])]
    views = []
    for clip in uniform_clips(row["num_frames"], 4, 2, 2):
        views.append(spatial_crops(torch.from_numpy(np.stack([frames[i] for i in clip])), 32, 3))
    with torch.no_grad():
        ref = model.backbone(normalize(torch.cat(views), torch.device("cpu"))).mean(0).numpy()
    np.testing.assert_allclose(f["embedding"][1], ref, rtol=1e-4, atol=1e-5)


def test_cache_reuse_and_invalidation(tiny, tmp_path):
    data, ckpt = tiny
    cfg = eval_cfg(data, ckpt, tmp_path)
    path = extract(cfg, "test")
    version = lance.dataset(str(path)).version
    mtime = (path / "_versions").stat().st_mtime_ns
    assert extract(cfg, "test") == path and (path / "_versions").stat().st_mtime_ns == mtime  # reused
    first = read_features(path)
    extract(eval_cfg(data, ckpt, tmp_path, num_clips=3), "test")  # protocol changed -> recomputed
    assert read_features(path)["metadata"]["protocol"]["num_clips"] == 3
    ckpt2 = make_checkpoint(tmp_path / "other.pt", seed=1)  # different checkpoint -> recomputed
    extract(eval_cfg(data, ckpt2, tmp_path), "test")
    again = read_features(path)
    assert again["metadata"]["checkpoint_sha256"] != first["metadata"]["checkpoint_sha256"]
    assert not np.allclose(again["embedding"], first["embedding"])
    assert lance.dataset(str(path)).version >= version


def _worker(rank: int, world: int, port: int, cfg: EvalConfig, result: str) -> None:
    """A torchrun-like process: only env vars; ``extract`` initialises the gloo group itself."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        path = extract(cfg, "train")
        assert dist.is_initialized() and dist.get_world_size() == world
        Path(f"{result}.{rank}").write_text(str(path))
    finally:
        moquad_dist.cleanup()  # what the CLI does on its way out


def test_one_and_two_ranks_give_the_same_features(tiny, tmp_path):
    data, ckpt = tiny
    one = read_features(extract(eval_cfg(data, ckpt, tmp_path / "one"), "train"))
    cfg2 = eval_cfg(data, ckpt, tmp_path / "two")
    mp.spawn(_worker, args=(2, free_port(), cfg2, str(tmp_path / "done")), nprocs=2, join=True)
    assert (tmp_path / "done.0").read_text() == (tmp_path / "done.1").read_text()
    two = read_features(Path((tmp_path / "done.0").read_text()))
    assert two["video_id"] == one["video_id"] and len(two["video_id"]) == 9  # odd count: no drop_last
    np.testing.assert_allclose(two["embedding"], one["embedding"], rtol=1e-5, atol=1e-6)


def test_compute_features_on_no_videos(tiny):
    data, ckpt = tiny
    model, _ = load_model(ckpt)
    idx, emb = compute_features(model.backbone, eval_cfg(data, ckpt, data), Split(data, "test"), [])
    assert idx == [] and emb.shape[0] == 0


def test_clear_errors(tiny, tmp_path):
    data, ckpt = tiny
    with pytest.raises(FileNotFoundError, match="split 'val'"):
        extract(eval_cfg(data, ckpt, tmp_path), "val")
    with pytest.raises(MoquadError, match="nope.pt not found; give RUN/checkpoints/last.pt"):
        extract(eval_cfg(data, tmp_path / "nope.pt", tmp_path), "test")
    with pytest.raises(ConfigError, match="crops must be one of 1, 3"):  # checked when the config is built
        eval_cfg(data, ckpt, tmp_path, crops=2)


def test_extract_and_retrieve_on_preprocessed_synthetic_videos(synth_root, tmp_path):
    """The real stage-1 output (synth -> preprocess) read by seeking; checked against a webdataset scan."""
    from moquad.config import PreprocessConfig
    from moquad.eval.retrieve import retrieve
    from moquad.preprocess.run import preprocess

    data = tmp_path / "shards"
    preprocess(PreprocessConfig(dataset="ucf101", root=str(synth_root), out=str(data), short_side=32, workers=1),
               quiet=True)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", num_clips=1, ks=(1, 5))
    res = retrieve(cfg)
    man = pq.read_table(data / "manifests" / "test.parquet")
    assert res["queries"] == man.num_rows and 0.0 <= res["top1"] <= res["top5"] <= 1.0
    f = read_features(tmp_path / "out" / "features" / "test.lance")
    row = man.slice(0, 1).to_pylist()[0]
    sample = next(s for s in wds.WebDataset(str(data / row["shard"]), shardshuffle=False)
                  if json.loads(s["json"])["video_id"] == row["video_id"])
    fo = row["frame_offsets"]
    clip = uniform_clips(row["num_frames"], 4, 2, 1)[0]
    frames = np.stack([simplejpeg.decode_jpeg(sample["jpgs"][fo[i] : fo[i + 1]]) for i in clip])
    model, _ = load_model(ckpt)
    with torch.no_grad():
        ref = model.eval().backbone(normalize(spatial_crops(torch.from_numpy(frames), 32, 1), torch.device("cpu")))
    np.testing.assert_allclose(f["embedding"][0], ref[0].numpy(), rtol=1e-4, atol=1e-5)


def test_an_eval_command_with_workers_prints_no_lance_fork_warning(tiny, tmp_path):
    """Lance warns "not fork-safe" at every fork once imported; the DataLoader workers never touch Lance, so an
    eval command (retrieve, 2 workers: both splits extracted, then searched) prints no such warning."""

    data, ckpt = tiny
    args = ["retrieve", "--data", data, "--checkpoint", ckpt, "--out", tmp_path / "eval", "--device", "cpu",
            "--frames", "4", "--size", "32", "--set", "workers=2"]
    done = clirun.python("-m", "moquad.cli", *map(str, args),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "eval" / "features" / "test.lance").is_dir()  # the workers forked after Lance was imported
    assert "fork-safe" not in done.stderr, done.stderr
