"""Frames made in memory written as one split of a dataset: the shard format without transcoding.

The same shards, manifest and dataset.json as ``moquad preprocess`` (one ``ShardWriter``), for videos rendered
in memory: the tests' coded videos, the benchmarks' synthetic datasets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import simplejpeg
import xxhash

from moquad import __version__
from moquad.data.store import SCHEMA_VERSION, read_info
from moquad.preprocess import manifest
from moquad.preprocess.shards import ShardWriter


def write_frames(out: str | Path, videos: Iterable[tuple[str, np.ndarray | list[bytes], int]], *,
                 split: str = "train", classes: Sequence[str], videos_per_shard: int = 64, quality: int = 90,
                 fps: float = 25.0) -> Path:
    """Write videos ``(video_id, frames, label)`` as one split of a dataset; ``frames`` is uint8 (T, H, W, 3) or
    the list of its JPEG-encoded frames.

    The same shards, manifest and dataset.json as ``moquad preprocess`` (the product's shard writer, without
    transcoding): for frames made in memory. Calling it again with another ``split`` adds that split.
    """
    out = Path(out)
    writer = ShardWriter(out, split, 0, 0, max_bytes=1 << 40)
    n = 0
    for n, (video_id, frames, label) in enumerate(videos, start=1):
        jpegs = frames if isinstance(frames, list) else \
            [simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=quality) for f in frames]
        height, width = simplejpeg.decode_jpeg_header(jpegs[0])[:2]
        payload = b"".join(jpegs)
        writer.add({
            "video_id": video_id, "split": split, "label": int(label), "class_name": classes[int(label)],
            "source_path": video_id, "jpgs_size": len(payload), "num_frames": len(jpegs), "fps": float(fps),
            "width": int(width), "height": int(height),
            "frame_offsets": np.concatenate([[0], np.cumsum([len(j) for j in jpegs])]).tolist(),
            "checksum": hashlib.sha256(payload).hexdigest(), "xxh3": xxhash.xxh3_128_hexdigest(payload),
        }, payload)
        if n % videos_per_shard == 0:
            writer.commit()
    writer.commit()
    ok, _ = manifest.read_records(out)
    rows = ok.filter(pc.equal(ok.column("split"), split)).sort_by([("shard", "ascending"), ("offset", "ascending")])
    manifest.write_table(rows, out / "manifests" / f"{split}.parquet")
    info_path = out / "dataset.json"
    info = read_info(out) if info_path.is_file() else {
        "schema_version": SCHEMA_VERSION, "name": out.name, "classes": list(classes), "splits": {}, "preprocess": {},
        "moquad_version": __version__}
    info["splits"][split] = n
    manifest.write_json(info, info_path)
    return out
