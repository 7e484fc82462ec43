"""Small datasets in the shard format for tests, written by the product's own shard writer.

``coded_video`` makes frames whose flat colour encodes (video number, frame index), so a test can
read back from loader output which video and which frame each pixel came from:
``R = 20 + 10 * video`` and ``G = 4 * frame`` (B fixed at 128). JPEG keeps flat colours within +-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moquad.preprocess.frames import write_frames  # noqa: F401 - the package's writer; tests import it from here


def coded_video(video: int, num_frames: int, height: int = 32, width: int = 40) -> np.ndarray:
    """uint8 (T, H, W, 3) flat frames: R = 20 + 10 * video, G = 4 * frame, B = 128."""
    if not 0 <= video <= 23 or num_frames > 64:
        raise ValueError("coded_video supports videos 0..23 and at most 64 frames")
    out = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    out[..., 0] = 20 + 10 * video
    out[..., 1] = (4 * np.arange(num_frames, dtype=np.uint8))[:, None, None]
    out[..., 2] = 128
    return out


def decode_code(pixel: np.ndarray) -> tuple[int, int]:
    """(video, frame) encoded by :func:`coded_video` in an RGB pixel (or a mean colour)."""
    r, g = float(pixel[0]), float(pixel[1])
    return int(round((r - 20) / 10)), int(round(g / 4))


def write_dataset(
    out: str | Path,
    videos: Sequence[tuple[str, np.ndarray, int]],
    *,
    split: str = "train",
    videos_per_shard: int = 4,
    quality: int = 95,
    fps: float = 30.0,
    classes: Sequence[str] | None = None,
) -> Path:
    """:func:`write_frames` with class names ``class{label}`` unless ``classes`` is given."""
    classes = classes or [f"class{i}" for i in range(max(int(v[2]) for v in videos) + 1)]
    return write_frames(out, videos, split=split, classes=classes, videos_per_shard=videos_per_shard, quality=quality,
                        fps=fps)


def coded_dataset(
    out: str | Path, num_videos: int = 8, num_frames: int = 48, videos_per_shard: int = 2, size: tuple[int, int] = (32, 40)
) -> Path:
    """A dataset of :func:`coded_video` videos ``v00, v01, ...`` (label = video % 4)."""
    videos = [(f"v{v:02d}", coded_video(v, num_frames, *size), v % 4) for v in range(num_videos)]
    return write_dataset(out, videos, videos_per_shard=videos_per_shard)


def make_checkpoint(path: Path, seed: int = 0, backbone: str = "tiny", data: str = "",
                    loader: dict | None = None) -> Path:
    """A pretrain checkpoint of a random model (BN statistics and scales made non-trivial), full resolved config;
    ``loader``: pre-training clip settings other than the defaults (``{"frames": 8, "size": 32}``)."""
    import torch

    from moquad import config as C
    from moquad.models import build_model
    from moquad.train import checkpoint

    torch.manual_seed(seed)
    model = build_model(backbone, proj_dim=16, proj_hidden=32)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    cfg = C.to_dict(C.PretrainConfig(backbone=backbone, data=data, proj_dim=16, proj_hidden=32, epochs=3,
                                     loader=C.LoaderConfig(**(loader or {}))))
    return checkpoint.save({"model": model.state_dict(), "optimizer": {}, "step": 7, "epoch": 2, "config": cfg,
                            "seeds": {"seed": seed}, "moquad_version": "test", "git": None}, path)


def shard_paths(data_dir: str | Path, split: str) -> list[Path]:
    """Sorted paths of the shards that hold ``split`` (from its manifest)."""
    from moquad.data.store import read_manifest

    return sorted({Path(data_dir) / s for s in read_manifest(data_dir, split).column("shard").to_pylist()})
