"""RAD-inter donors: frames of random OTHER videos of the split, read by index, one pool per batch.

For each batch the loader draws ``max(donors_per_sample * batch, k * k + 1)`` distinct videos of the split
at random (seeded by seed, epoch, batch and rank), reads ONE random frame of each by its byte range (a
single small read each, thanks to the manifest's frame index), decodes it (at reduced size with
``scaled_decode``: :func:`donor_pool`) and stores it at the RAD window size. Each disturbed view then fills
its ``k * k`` windows from that pool with DISTINCT videos, never its own: a
mosaic holds ``min(k * k, videos - 1)`` distinct videos whatever the per-rank batch (fewer only if donor
frames fail to read). Videos from shards other than the sample's come first (donors are then
uncorrelated with the shard being read: the cross-shard donors of the design), then other videos of its
shard; only a split with fewer than ``k * k + 1`` videos repeats donors within a mosaic.
A donor frame that fails to read or decode is left out of the pool (it is not a training sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from moquad.data.store import BadSample, Split, decode_jpeg, largest_reduction
from moquad.data.views import DonorPick
from moquad.errors import MoquadError, setting


def resize_cells(frames: torch.Tensor, cell: int) -> torch.Tensor:
    """uint8 frames (N, H, W, 3) -> uint8 (N, cell, cell, 3) (bilinear, antialiased, aspect not kept)."""
    x = frames.permute(0, 3, 1, 2)
    x = F.interpolate(x, size=(cell, cell), mode="bilinear", antialias=True, align_corners=False)
    return x.permute(0, 2, 3, 1).contiguous()


@dataclass
class DonorPool:
    """Donor frames of one batch: ``cells`` uint8 (P, c, c, 3) and where each came from."""

    cells: torch.Tensor
    video: np.ndarray  # (P,) manifest index of the donor video
    shard: np.ndarray  # (P,) its shard id
    ids: list[str]
    bytes_read: int = 0

    def picker(self, video: int, shard: int) -> DonorPick:
        """``pick(count, rng)`` for one sample: ``count`` windows of distinct other videos (as many as the pool
        holds, then repeats), those of other shards first, in random window order."""
        other_video = self.video != video
        other_shard = other_video & (self.shard != shard)
        first, then = np.flatnonzero(other_shard), np.flatnonzero(other_video & ~other_shard)
        if len(first) + len(then) == 0:
            raise MoquadError("RAD-inter needs donor frames from other videos but none could be read (a split "
                              f"of one video?); use {setting('loader.appearance_op', 'rad_intra')} or add videos")

        def pick(count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
            order = np.concatenate([rng.permutation(first), rng.permutation(then)])
            extra = order[rng.integers(0, len(order), size=max(0, count - len(order)))]
            chosen = rng.permutation(np.concatenate([order[:count], extra]))
            return chosen, [self.ids[int(c)] for c in chosen]

        return pick


def donor_picks(split: Split, count: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(video, frame) of ``count`` distinct random videos (at least two when possible), one random frame each:
    what :func:`donor_pool` reads (known before any read, so a loader can start the reads ahead)."""
    n = len(split)
    count = min(n, max(2, count))
    chosen = rng.choice(n, size=count, replace=False) if count < n else rng.permutation(n)
    return [(i, int(rng.integers(0, split.num_frames[i]))) for i in chosen.tolist()]


def donor_pool(split: Split, picks: list[tuple[int, int]], cell: int, scaled: bool = False) -> DonorPool:
    """Read and decode the frames ``picks`` (:func:`donor_picks`) at the window size ``cell``; ``scaled``: each
    decoded at the largest reduction (1/8, 1/4, 1/2) that keeps ``2 * cell`` pixels on its short side (256-px
    frames, 23-px windows: 1/4, windows within 50 dB PSNR of full-size decoding; 1/8, its 8x8 block means, 33 dB)."""
    frames, videos, used = [], [], 0
    for (i, _), data in zip(picks, split.frame_bytes_many(picks)):  # the reads overlap on an object store
        hw = (int(split.height[i]), int(split.width[i]))
        reduce = largest_reduction(hw, 2 * cell) if scaled else 1
        try:
            if isinstance(data, Exception):
                raise data
            used += len(data)
            frames.append(decode_jpeg(data, reduce=reduce, hw=hw))
        except (BadSample, OSError):
            continue
        videos.append(i)
    video = np.asarray(videos, dtype=np.int64)
    if frames:
        sizes = {fr.shape for fr in frames}
        cells = torch.cat([resize_cells(torch.from_numpy(fr[None]), cell) for fr in frames]) if len(sizes) > 1 \
            else resize_cells(torch.from_numpy(np.stack(frames)), cell)
    else:
        cells = torch.zeros((0, cell, cell, 3), dtype=torch.uint8)
    return DonorPool(cells, video, split.shard[video], [str(split.video_id[i]) for i in videos], used)
