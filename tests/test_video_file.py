"""A user's video file outside preprocessing: its frames, or one line that names the file and what to do, for a
file PyAV cannot open, one without a video stream (an AVI header and noise) and a truncated one."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from moquad.data.video_file import UnreadableVideo, decode_frames
from moquad.errors import MoquadError


def write_avi(path: Path, frames: int = 12, height: int = 32, width: int = 48) -> Path:
    """An MPEG-4 AVI whose frame i is the grey level 20 * i (mod 256)."""
    with av.open(str(path), "w", format="avi") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 20 * i % 256, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def bad_videos(folder: Path) -> dict[str, Path]:
    """name -> a file that is not a readable video: noise, an AVI header and noise, a truncated AVI."""
    folder.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    whole = write_avi(folder / "whole.avi").read_bytes()
    files = {"noise": (folder / "noise.mp4", noise),
             "no video stream": (folder / "header.avi", b"RIFF" + (4096).to_bytes(4, "little") + b"AVI LIST" + noise),
             "truncated": (folder / "truncated.avi", whole[: len(whole) // 2])}
    for path, data in files.values():
        path.write_bytes(data)
    (folder / "whole.avi").unlink()
    return {k: p for k, (p, _) in files.items()}


def test_frames_of_a_readable_file(tmp_path):
    x = decode_frames(write_avi(tmp_path / "v.avi"), lambda f: f.to_ndarray(format="rgb24"))
    assert x.shape == (12, 32, 48, 3)
    assert np.abs(x.mean((1, 2, 3)) - 20 * np.arange(12)).max() < 5  # the grey levels written, after MPEG-4 and YUV
    assert len(decode_frames(tmp_path / "v.avi", lambda f: f.to_ndarray(format="rgb24"), limit=5)) == 5


@pytest.mark.parametrize("kind", ["noise", "no video stream", "truncated"])
def test_a_file_that_is_not_a_video_is_one_line(tmp_path, kind):
    path = bad_videos(tmp_path)[kind]
    with pytest.raises(UnreadableVideo) as e:
        decode_frames(path, lambda f: f.to_ndarray(format="rgb24"))
    said = str(e.value)
    assert isinstance(e.value, MoquadError) and "\n" not in said
    assert said.startswith(f"{path}: not a readable video (") and f"ffprobe {path}" in said
    assert f"ffmpeg -i {path} -c:v libx264 {path.stem}_fixed.mp4" in said
    if kind == "no video stream":
        assert "(no video stream)" in said
