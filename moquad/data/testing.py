"""Small datasets in the shard format, for tests and benchmarks of the loader.

``coded_video`` makes frames whose flat colour encodes (video number, frame index), so a test can
read back from loader output which video and which frame each pixel came from:
``R = 20 + 10 * video`` and ``G = 4 * frame`` (B fixed at 128). JPEG keeps flat colours within +-1.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import simplejpeg


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


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o444
    return info


def write_dataset(
    out: str | Path,
    videos: Sequence[tuple[str, np.ndarray, int]],
    *,
    split: str = "train",
    videos_per_shard: int = 4,
    quality: int = 95,
    fps: float = 30.0,
) -> Path:
    """Write ``(video_id, frames uint8 (T, H, W, 3), label)`` as shards + manifest + dataset.json.

    Follows the data format of CONTRACTS.md (one tar sample per video: ``{key}.json`` +
    ``{key}.jpgs``); ``videos_per_shard`` videos go in each shard. Calling it again with another
    ``split`` adds that split.
    """
    out = Path(out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    (out / "manifests").mkdir(parents=True, exist_ok=True)
    rows = []
    for s in range(0, len(videos), videos_per_shard):
        rel = f"shards/{split}-000-{s // videos_per_shard:06d}.tar"
        with tarfile.open(out / rel, "w", format=tarfile.PAX_FORMAT) as tar:
            for video_id, frames, label in videos[s : s + videos_per_shard]:
                jpegs = [simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=quality) for f in frames]
                offsets = np.concatenate([[0], np.cumsum([len(j) for j in jpegs])]).tolist()
                payload = b"".join(jpegs)
                key = video_id.replace(".", "_").replace("/", "_").replace(" ", "_")
                row = {
                    "video_id": video_id, "split": split, "label": int(label), "class_name": f"class{label}",
                    "source_path": f"{video_id}.avi", "jpgs_size": len(payload), "num_frames": len(frames),
                    "fps": fps, "width": int(frames.shape[2]), "height": int(frames.shape[1]),
                    "frame_offsets": offsets, "checksum": hashlib.sha256(payload).hexdigest(),
                }
                meta = json.dumps(row).encode()
                offset = tar.offset
                tar.addfile(_tarinfo(f"{key}.json", len(meta)), io.BytesIO(meta))
                info = _tarinfo(f"{key}.jpgs", len(payload))
                jpgs_offset = tar.offset + len(info.tobuf(tar.format, tar.encoding, tar.errors))
                tar.addfile(info, io.BytesIO(payload))
                rows.append({**row, "shard": rel, "offset": offset, "jpgs_offset": jpgs_offset})
    pq.write_table(pa.Table.from_pylist(rows), out / "manifests" / f"{split}.parquet")
    info_path = out / "dataset.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {
        "schema_version": 1, "name": out.name, "classes": [], "splits": {}, "preprocess": {}, "moquad_version": "test",
    }
    labels = sorted({int(v[2]) for v in videos})
    info["classes"] = sorted(set(info["classes"]) | {f"class{lab}" for lab in labels})
    info["splits"][split] = len(videos)
    info_path.write_text(json.dumps(info, indent=1))
    return out


def coded_dataset(
    out: str | Path, num_videos: int = 8, num_frames: int = 48, videos_per_shard: int = 2, size: tuple[int, int] = (32, 40)
) -> Path:
    """A dataset of :func:`coded_video` videos ``v00, v01, ...`` (label = video % 4)."""
    videos = [(f"v{v:02d}", coded_video(v, num_frames, *size), v % 4) for v in range(num_videos)]
    return write_dataset(out, videos, videos_per_shard=videos_per_shard)
