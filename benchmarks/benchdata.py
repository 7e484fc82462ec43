"""What the loader benchmarks share: the real clips, the K400-like dataset made from them, one epoch of the
loader, PyAV's seek + decode, the JPEG decode bound of a batch, and CPU seconds with children.

A module of this folder, imported by name (a script's own folder is on ``sys.path`` when it runs).
"""

from __future__ import annotations

import resource
import shutil
import time
from pathlib import Path

import av
import numpy as np

from moquad.config import LoaderConfig, PreprocessConfig
from moquad.data.pipeline import make_loader
from moquad.data.store import Split, decode_jpeg

clock = time.process_time  # CPU seconds of this process: what one dedicated worker core would take

# ../shared/data/real-videos of the first folder above this file that has it (a git worktree sits one level deeper)
REAL = next((p / "shared" / "data" / "real-videos" for p in Path(__file__).resolve().parents
             if (p / "shared" / "data" / "real-videos").is_dir()),
            Path(__file__).resolve().parents[2] / "shared" / "data" / "real-videos")
K400_LIKE = ["R6llTwEh07w.mp4", "SOX5yA1l24A.mp4", "WUzgd7C1pWA.mp4", "demo.mp4", "test.mp4"]
COPIES = 8
BATCH = 8


def build_dataset(cache: Path, shard_size: int = 20_000_000, name: str = "shards40c", short_side: int = 128) -> Path:
    """Preprocess the K400-like clips (8 copies each) once at short side ``short_side`` into ``cache/NAME``."""
    out = cache / name
    if (out / "manifests" / "train.parquet").is_file():
        return out
    from moquad.preprocess.run import preprocess

    root = cache / "videos40" / "k400"
    root.mkdir(parents=True, exist_ok=True)
    for name in K400_LIKE:
        for c in range(COPIES):
            copy = root / f"c{c}_{name}"
            if not copy.exists():
                shutil.copyfile(REAL / name, copy)  # a real file: a symlink would be deduplicated
    preprocess(PreprocessConfig(dataset="folder", root=str(cache / "videos40"), out=str(out), short_side=short_side,
                                workers=2, shard_size=shard_size), quiet=True)
    return out


def run_loader(data: Path, cfg: LoaderConfig, epoch: int, keep: bool = False) -> tuple[float, int, list[dict]]:
    """(seconds, quadruples, batches if ``keep``) of one epoch of the loader. Timed rows drop each batch as it
    comes (``keep=False``): kept, every batch's tensors would be fresh memory, whose page faults (~20 ms per
    134 MB ``raw`` batch at 256 px here, several times more for memory this VM never touched) swamp the rows."""
    batches, n, t0 = [], 0, clock()
    for b in make_loader(data, cfg, batch_size=BATCH, epoch=epoch):
        n += len(b["video_id"])
        if keep:
            batches.append(b)
        del b
    return clock() - t0, n, batches


def pyav_frames(path: str, wanted: np.ndarray) -> dict[int, np.ndarray]:
    """pytorchvideo-style: seek to the first wanted frame, decode to the last, keep the wanted ones."""
    want = set(int(i) for i in wanted)
    first, last, got = min(want), max(want), {}
    with av.open(path, metadata_errors="replace") as container:
        stream = container.streams.video[0]
        fps, tb = float(stream.average_rate), float(stream.time_base)
        start = stream.start_time or 0
        container.seek(start + int(first / fps / tb), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            i = int(round((frame.pts - start) * tb * fps))
            if i in want and i not in got:
                got[i] = frame.to_ndarray(format="rgb24")
            if i >= last:
                break
    keys = np.array(sorted(got))
    for i in want - set(got):  # timestamp rounding: the nearest decoded frame
        got[i] = got[int(keys[np.abs(keys - i).argmin()])]
    return got


def run_decode_bound(batches: list[dict], split: Split, reduce: str = "none") -> float:
    """Seconds to decode the distinct frames of every quadruple: full size (``none``), at the reductions the loader
    chose (``loader``: its per-video info), or every frame at 1/2 (``half``: the ceiling of reduced decoding at 1/2)."""
    total = 0.0
    row = {str(v): i for i, v in enumerate(split.video_id)}
    for b in batches:
        for vid, info in zip(b["video_id"], b["info"]):
            i = row[vid]
            payload, fo = split.payload(i, verify=False), split.frame_offsets(i)
            hw = (int(split.height[i]), int(split.width[i]))
            frames = np.unique(np.concatenate([np.asarray(x) for x in info["indices"]]))  # = the loader's order
            scale = info["reduce"].tolist() if reduce == "loader" else [2 if reduce == "half" else 1] * len(frames)
            t0 = clock()
            for f, r in zip(frames.tolist(), scale):
                decode_jpeg(memoryview(payload)[fo[f] : fo[f + 1]], reduce=r, hw=hw)
            total += clock() - t0
    return total


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (ffmpeg, the pool's workers) so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
