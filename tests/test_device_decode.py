"""``augment.decode_batch`` (decode_on_device): an undecodable frame is a BadSample naming its video and row."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
import torch

from moquad.data.augment import decode_batch
from moquad.data.store import BadSample


def _batch(frames: list[list[bytes]]) -> dict:
    flat = [j for video in frames for j in video]
    ends = np.cumsum([0] + [len(j) for j in flat])
    return {"jpeg": torch.frombuffer(bytearray(b"".join(flat)), dtype=torch.uint8),
            "jpeg_offsets": torch.from_numpy(ends), "jpeg_count": torch.tensor([len(v) for v in frames]),
            "hw": torch.tensor([[16, 24]] * len(frames)), "video_id": [f"v{i}" for i in range(len(frames))]}


def test_an_undecodable_frame_names_its_video_and_row():
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, (16, 24, 3), dtype=np.uint8) for _ in range(5)]
    good = [simplejpeg.encode_jpeg(i, quality=95) for i in imgs]
    raw = decode_batch(_batch([good[:2], good[2:]]), "cpu")
    assert raw.shape == (2, 3, 16, 24, 3)
    ref = simplejpeg.decode_jpeg(good[3])  # an independent decoder
    assert np.abs(raw[1, 1].numpy().astype(int) - ref.astype(int)).max() <= 2
    broken = b"\xff\xd8" + b"garbage" * 20
    with pytest.raises(BadSample, match=r"^frame 1 of video v1 is not a decodable JPEG") as e:
        decode_batch(_batch([good[:2], [good[2], broken, good[4]]]), "cpu")
    assert e.value.position == 1
