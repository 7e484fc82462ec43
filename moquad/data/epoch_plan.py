"""Exact epochs: which videos rank ``r``'s batch ``j`` of epoch ``e`` holds.

Epoch ``e`` is a permutation of the split drawn from ``(seed, e)``, the same on every rank. With
``G = per-rank batch x world size`` the epoch has ``videos // G`` global batches; global batch ``j`` is
permutation slice ``[j*G, (j+1)*G)`` and rank ``r`` takes its ``r``-th part. Hence:

- no video appears twice in a global batch, and every rank gets the same number of batches;
- across an epoch each video fills at most ONE slot of its own (the slot of the batch its permutation
  position falls in), and ``videos // G * G`` distinct videos fill those slots;
- the ``videos % G`` videos left over change with the permutation, so over epochs every video is used;
- batch ``j`` is computed, never found by reading the batches before it (resume in O(1)).

Spares: a sample that turns out to be unreadable is replaced by a spare, a video outside the current
global batch: first the epoch's left-over videos, then those of later, then of earlier batches. Rank
``r`` only takes spares at positions ``q`` with ``q % world == r``, so two ranks never pick the same
spare and the global batch stays free of duplicates. So with bad samples "at most once" becomes: at
most once in its own slot, plus at most once per OTHER batch in which it stands in for a bad sample;
each use draws its own views (:func:`stream` with ``use`` = 0 in its own slot, ``j + 1`` as a spare in
batch ``j``), so a spare never repeats the views it gets in its own batch.

Random streams: every random choice of the loader comes from :func:`stream`, whose first word tags the
kind (permutation, views, donors). numpy's ``SeedSequence`` ignores trailing zeros (``[s, e]`` and
``[s, e, 0]`` are one stream), so untagged seeds of different lengths could collide.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from moquad.errors import MoquadError, setting

# first word of each kind of random stream (distinct, so no two kinds ever share a stream)
STREAMS = {"permutation": 0x5045524D, "views": 0x56494557, "donors": 0x444F4E52}


def stream(kind: str, *words: int) -> np.random.Generator:
    """The generator of one random stream of the loader: ``kind`` in STREAMS, then seed, epoch, ..."""
    return np.random.default_rng([STREAMS[kind], *(int(w) for w in words)])


class EpochPlan:
    """The batches of one epoch for every rank (cheap: one permutation of the split)."""

    def __init__(self, num_videos: int, per_rank: int, world_size: int, seed: int, epoch: int) -> None:
        if per_rank < 1 or world_size < 1:
            raise ValueError(f"per-rank batch and world size must be >= 1, got {per_rank} and {world_size}")
        self.num_videos, self.per_rank, self.world = num_videos, per_rank, world_size
        self.global_batch = per_rank * world_size
        if num_videos < self.global_batch:
            raise MoquadError(
                f"the global batch of {self.global_batch} videos ({per_rank} per rank x {world_size} ranks) is larger "
                f"than the split ({num_videos} videos); use {setting('batch_size', max(1, num_videos // world_size) * world_size)}"
                " or less (each video may appear only once per batch)"
            )
        self.num_batches = num_videos // self.global_batch
        self.order = stream("permutation", seed, epoch).permutation(num_videos)

    def batch(self, j: int, rank: int) -> np.ndarray:
        """Manifest indices of rank ``rank``'s part of global batch ``j``."""
        if not 0 <= j < self.num_batches or not 0 <= rank < self.world:
            raise IndexError(f"batch {j} of {self.num_batches}, rank {rank} of {self.world}")
        start = j * self.global_batch + rank * self.per_rank
        return self.order[start : start + self.per_rank]

    def spares(self, j: int, rank: int) -> Iterator[int]:
        """Replacement videos for rank ``rank`` in batch ``j`` (outside global batch ``j``, rank-disjoint)."""
        g, used = self.global_batch, self.num_batches * self.global_batch
        ranges = [range(used, self.num_videos), range((j + 1) * g, used), range(0, j * g)]
        for positions in ranges:
            for q in positions:
                if q % self.world == rank:
                    yield int(self.order[q])
