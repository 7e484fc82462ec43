"""Small datasets in the shard format for tests, written by the product's own shard writer.

``coded_video`` makes frames whose flat colour encodes (video number, frame index), so a test can
read back from loader output which video and which frame each pixel came from:
``R = 20 + 10 * video`` and ``G = 4 * frame`` (B fixed at 128). JPEG keeps flat colours within +-1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import simplejpeg
import xxhash

from moquad.data.store import SCHEMA_VERSION
from moquad.preprocess import manifest
from moquad.preprocess.shards import ShardWriter


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
    """Write ``(video_id, frames uint8 (T, H, W, 3), label)`` as shards + manifest + dataset.json.

    ``videos_per_shard`` videos go in each shard (``ShardWriter``, as ``moquad preprocess`` writes them).
    Calling it again with another ``split`` adds that split. Class names: ``classes[label]``, else ``class{label}``.
    """
    name = (lambda label: classes[label]) if classes else (lambda label: f"class{label}")
    out = Path(out)
    writer = ShardWriter(out, split, 0, 0, max_bytes=1 << 40)
    for n, (video_id, frames, label) in enumerate(videos):
        jpegs = [simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=quality) for f in frames]
        payload = b"".join(jpegs)
        writer.add({
            "video_id": video_id, "split": split, "label": int(label), "class_name": name(int(label)),
            "source_path": f"{video_id}.avi", "jpgs_size": len(payload), "num_frames": len(frames), "fps": fps,
            "width": int(frames.shape[2]), "height": int(frames.shape[1]),
            "frame_offsets": np.concatenate([[0], np.cumsum([len(j) for j in jpegs])]).tolist(),
            "checksum": hashlib.sha256(payload).hexdigest(), "xxh3": xxhash.xxh3_128_hexdigest(payload),
        }, payload)
        if (n + 1) % videos_per_shard == 0:
            writer.commit()
    writer.commit()
    ok, _ = manifest.read_records(out)
    rows = ok.filter(pc.equal(ok.column("split"), split)).sort_by([("shard", "ascending"), ("offset", "ascending")])
    manifest.write_table(rows, out / "manifests" / f"{split}.parquet")
    info_path = out / "dataset.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {
        "schema_version": SCHEMA_VERSION, "name": out.name, "classes": [], "splits": {}, "preprocess": {},
        "moquad_version": "test",
    }
    info["classes"] = list(classes) if classes else sorted(set(info["classes"]) | {name(int(v[2])) for v in videos})
    info["splits"][split] = len(videos)
    manifest.write_json(info, info_path)
    return out


def coded_dataset(
    out: str | Path, num_videos: int = 8, num_frames: int = 48, videos_per_shard: int = 2, size: tuple[int, int] = (32, 40)
) -> Path:
    """A dataset of :func:`coded_video` videos ``v00, v01, ...`` (label = video % 4)."""
    videos = [(f"v{v:02d}", coded_video(v, num_frames, *size), v % 4) for v in range(num_videos)]
    return write_dataset(out, videos, videos_per_shard=videos_per_shard)
