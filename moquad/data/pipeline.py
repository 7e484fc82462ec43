"""The pre-training loader: the manifest is the dataset, epochs are exact, a batch is ONE computed item.

Per rank and epoch, batch ``j`` (:class:`~moquad.data.epoch_plan.EpochPlan`) is built by one DataLoader
worker in small stages, all driven by the manifest (:class:`~moquad.data.store.Split`):

    videos of batch j -> read payloads by offset (from a store: started one batch ahead, in the background)
      + xxh3 -> draw ViewParams (seeded per video: epoch_plan.STREAMS)
      -> decode the frames the views use into the batch -> what the appearance op needs (ops.APPEARANCE_OPS:
      RAD donors, one frame of random other videos read by index, or the video's own frames)
      -> apply_views (here) or ship frames + parameters (augment_on_device)

- Reduced-size decoding (``scaled_decode``, not with ``decode_on_device``): a frame is decoded at 1/2, 1/4 or
  1/8 (libjpeg-turbo's DCT scaling) when every crop box using it still covers the output at that scale; the
  boxes are then given in the reduced frames' pixels (views.reduce_views), each edge moved to the nearest
  reduced pixel (<= r/2 source pixels). ``raw`` holds each frame at the top left of its slot.

- Deterministic whatever the number of workers: the DataLoader hands out batch indices in order, and
  every random choice is seeded by ``(seed, epoch, video)`` (views) or ``(seed, epoch, batch, rank)``
  (donor pool), never by a worker's state. Resuming at step k starts the sampler at batch k.
- Bad samples: a payload that fails its checksum or a frame that fails to decode is replaced by a spare
  video (outside the global batch, rank-disjoint), so batches stay full and equal on every rank; the
  batch lists each skip in ``bad`` (video_id, shard, reason) for ``RUN/bad_samples.jsonl``.
- Only the shards the manifest names are opened, each sample with ONE read of its payload (store.read_bytes: a
  pread, so an I/O error of a cluster file system is a bad sample, never a SIGBUS); a missing or
  short shard is an error at start-up. ``bytes`` reports what a batch read (payloads + donor frames).
- Multi-node safety: when a torch.distributed group is initialised, ``world_size``/``rank`` must match it.
- Once per run: :class:`RunLoader` reads the manifest and checks the shards once and keeps its workers across
  epochs; an epoch (or a resume at step k) only sets the sampler, which sends ``(epoch, j)`` to the workers.
"""

from __future__ import annotations

import atexit
import dataclasses
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from moquad import objstore
from moquad.config import LoaderConfig
from moquad.data.augment import apply_views
from moquad.data.donors import DonorPool, donor_picks, donor_pool, resize_cells
from moquad.data.epoch_plan import EpochPlan, stream
from moquad.data.ops import APPEARANCE_OPS
from moquad.data.store import BadSample, Split, decode_frames, decode_jpeg, reduced_hw
from moquad.data.views import (
    ViewParams,
    ViewPlan,
    cell_size,
    check_config,
    draw_views,
    needs_donors,
    quadruple,
    reduce_views,
)
from moquad.data.workers import ignore_preemption, track
from moquad.errors import MoquadError
from moquad.objstore import Location

_STACKED = ("frame_index", "box", "flip", "colour_ops", "colour_factors", "lam")  # + the op's own params


PREFETCH = 2  # batches each DataLoader worker works ahead (DataLoader's prefetch_factor)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, ring: BufferRing | None = None, name: str = "") -> torch.Tensor:
    """Uninitialised tensor, in shared memory inside a DataLoader worker (no copy when it is sent): buffer ``name``
    of ``ring`` when given (:class:`BufferRing`), else fresh."""
    if get_worker_info() is None:  # numpy's allocator reuses big blocks: no page faults per batch
        return torch.from_numpy(np.empty(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))
    nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    storage = ring.storage(name, nbytes) if ring is not None else torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _zeros(shape: tuple[int, ...], ring: BufferRing | None = None) -> torch.Tensor:
    """uint8 ``raw`` frames: a worker's shared memory (fresh: zero filled; from ``ring``: what an earlier batch left in
    the padding), or calloc'd pages in this process. Decoding touches the frames' pages only; nothing reads the
    padding (views read their boxes, inside their frames)."""
    return _empty(shape, torch.uint8, ring, "raw") if get_worker_info() is not None else \
        torch.from_numpy(np.zeros(shape, np.uint8))


class BufferRing:
    """A worker's shared-memory batch buffers, each reused every ``PREFETCH + 1`` batches instead of made anew.

    A fresh shared buffer costs its allocation and a page fault per 4 kB page (zero filled by the kernel) on every
    batch: 14 ms for the 19 MB of uint8 views of a batch of 8 quadruples on a 2-core CPU, where a real worker
    made 1.6-1.9x more quadruples per CPU second with recycled buffers (benchmarks/bench_loader.py); on an H200
    machine's 16 cores, where pages fault in cheaply, 0-10 % more. Reuse is safe when the consumer is done with each
    batch (or has copied it) before it asks for the next: the DataLoader deals a worker's batches in turn and sends a
    worker its batch n only after it has handed over that worker's batch n - PREFETCH, so the buffer of batch
    n - PREFETCH - 1 is no longer read. ``pin_memory`` copies every batch into pinned memory as it arrives; the
    trainer's steps are done with their batch (to_model makes new tensors) on any device. A caller who keeps batches
    (or tensors of them) must not ask for it.
    """

    def __init__(self) -> None:
        self.batch, self.buffers = -1, {}

    def next_batch(self) -> None:
        self.batch += 1

    def storage(self, name: str, nbytes: int) -> torch.UntypedStorage:
        """Shared storage of >= ``nbytes`` for buffer ``name`` of the current batch (the same one every PREFETCH + 1
        batches; a batch that asks twice, e.g. decoding again after a bad sample, gets the same one)."""
        key = (name, self.batch % (PREFETCH + 1))
        old = self.buffers.get(key)
        if old is None or old.nbytes() < nbytes:
            self.buffers[key] = None  # freed before the bigger one is made
            old = self.buffers[key] = torch.UntypedStorage._new_shared(nbytes)
        return old


def _decode_into(out: np.ndarray, payload: bytes, offsets: np.ndarray, frames: np.ndarray,
                 hw: tuple[int, int], reduce: np.ndarray) -> None:
    """Decode ``frames`` of one video (``hw`` pixels), each at ``1 / reduce`` (store.decode_jpeg), straight into
    ``out`` (>= U, >= H, >= W, 3) at the top left. The padding is left as it is (zeros in a :func:`_zeros` buffer;
    nothing reads it: views read their boxes, inside their frames)."""
    view, at, full_w = memoryview(payload), offsets.tolist(), out.shape[2]
    for j, (f, r) in enumerate(zip(frames.tolist(), reduce.tolist())):
        height, width = reduced_hw(hw, r)
        frame = decode_jpeg(view[at[f] : at[f + 1]], out=out[j, :height] if width == full_w else None, reduce=r, hw=hw)
        if frame.shape[:2] != (height, width):
            raise BadSample(f"frame of {frame.shape[1]}x{frame.shape[0]} pixels at 1/{r}, the manifest says "
                            f"{hw[1]}x{hw[0]}")
        if width != full_w:
            out[j, :height, :width] = frame


def check_jpegs(payload: bytes, offsets: np.ndarray, frames: np.ndarray, hw: tuple[int, int]) -> None:
    """``decode_on_device``: the frames' JPEG markers and headers (cheap, no decode) -> BadSample when broken.

    A payload that passed its checksum holds the JPEGs preprocessing encoded; this catches the rest (checksums
    off, a bad encode) in the worker, where a spare can still replace the sample."""
    view = memoryview(payload)
    for f in frames.tolist():
        data = view[offsets[f] : offsets[f + 1]]
        if len(data) < 4 or bytes(data[:2]) != b"\xff\xd8" or bytes(data[-2:]) != b"\xff\xd9":
            raise BadSample(f"frame {f} is not a whole JPEG (start/end markers missing)")
        try:
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
        except (ValueError, RuntimeError) as e:
            raise BadSample(f"frame {f}: JPEG header unreadable: {e}") from None
        if (height, width) != hw:
            raise BadSample(f"frame of {width}x{height} pixels, the manifest says {hw[1]}x{hw[0]}")


class EpochBatches(Dataset):
    """Map-style dataset whose item ``j`` is rank ``rank``'s whole batch ``j`` of the epoch."""

    def __init__(self, split: Split, cfg: LoaderConfig, plan: EpochPlan, epoch: int, rank: int, *,
                 views: ViewPlan, end: int | None = None, ring: BufferRing | None = None) -> None:
        self.split, self.cfg, self.plan, self.epoch, self.rank, self.views = split, cfg, plan, epoch, rank, views
        self.ring = ring  # the worker's recycled shared buffers (BufferRing), or None: fresh ones
        self.end = plan.num_batches if end is None else end  # the loader's last batch + 1 (no reads past it)
        self.augment_on_device = cfg.augment_on_device or cfg.decode_on_device
        self.scaled = cfg.scaled_decode and not cfg.decode_on_device  # nvJPEG decodes full size
        self._scratch: np.ndarray | None = None  # the default path's frame buffer (_frame_buffer)

    def __len__(self) -> int:
        return self.plan.num_batches

    def __getitem__(self, j: int) -> dict[str, Any]:
        cfg, split = self.cfg, self.split
        if self.ring is not None:
            self.ring.next_batch()
        rows = [int(i) for i in self.plan.batch(j, self.rank)]
        picks = self._donor_picks(j)
        self._start_reads(j, rows, picks)
        # picks: only when the views need donors; reduced-size donor decoding in every path (one pool, one result)
        pool = donor_pool(split, picks, cell_size(cfg), cfg.scaled_decode) if picks else None
        spares = self.plan.spares(j, self.rank)
        bad: list[dict[str, str]] = []
        drawn = [self._draw(i, j, pool, spares, bad) for i in rows]
        while True:  # decode; a sample that fails to decode is replaced and the batch decoded again
            try:
                return self._collate(drawn, pool, bad)
            except _DecodeFailed as e:
                i = drawn[e.pos][0]
                bad.append(self._bad(i, str(e.reason)))
                drawn[e.pos] = self._draw(self._next_spare(spares), j, pool, spares, bad, spare=True)

    def _start_reads(self, j: int, rows: list[int], picks: list[tuple[int, int]]) -> None:
        """On an object store, start batch ``j``'s reads and those of this worker's next batch (the DataLoader
        deals batches out in turn), so their latency overlaps with this batch's work; none past the loader's end."""
        if not objstore.is_url(self.split.data_dir):
            return
        worker = get_worker_info()
        after = j + (worker.num_workers if worker is not None else 1)
        later = [(self.plan.batch(after, self.rank).tolist(), self._donor_picks(after))] if after < self.end else []
        self.split.prefetch((rows, picks), *later)

    def _donor_picks(self, j: int) -> list[tuple[int, int]]:
        """Batch ``j``'s RAD donor frames (none when the views need none): enough videos for k*k distinct other
        videos in every mosaic (module donors), drawn from the batch's own stream."""
        cfg = self.cfg
        if not needs_donors(cfg, self.views):
            return []
        count = max(cfg.donors_per_sample * self.plan.per_rank, cfg.rad_k ** 2 + 1)
        return donor_picks(self.split, count, stream("donors", cfg.seed, self.epoch, j, self.rank))

    def _next_spare(self, spares: Iterator[int]) -> int:
        spare = next(spares, None)
        if spare is None:
            raise MoquadError(f"no readable spare video left in {self.split.data_dir} split {self.split.split!r}; "
                              f"run `moquad verify {self.split.data_dir}`")
        return spare

    def _bad(self, i: int, reason: str) -> dict[str, str]:
        return {"video_id": str(self.split.video_id[i]), "shard": self.split.shards[int(self.split.shard[i])],
                "reason": reason, "epoch": self.epoch}

    def _draw(self, i: int, j: int, pool: DonorPool | None, spares: Iterator[int], bad: list,
              spare: bool = False) -> tuple:
        """(index, payload, ViewParams) of video ``i`` in batch ``j`` or, if its bytes are bad, of a spare; a spare's
        views are drawn for this batch (stream ``use`` j + 1), never the ones of its own slot (``use`` 0)."""
        split, cfg = self.split, self.cfg
        while True:
            try:
                payload = split.payload(i, verify=cfg.verify_checksums)
                break
            except (BadSample, OSError) as e:
                bad.append(self._bad(i, str(e)))
                i, spare = self._next_spare(spares), True
        rng = stream("views", cfg.seed, self.epoch, i, j + 1 if spare else 0)
        pick = pool.picker(i, int(split.shard[i])) if pool is not None else None
        hw = (int(split.height[i]), int(split.width[i]))
        return i, payload, draw_views(int(split.num_frames[i]), hw, cfg, rng, pick, str(split.video_id[i]),
                                      self.views)

    def _hw(self, i: int) -> tuple[int, int]:
        return int(self.split.height[i]), int(self.split.width[i])

    def _reductions(self, drawn: list[tuple[int, bytes, ViewParams]]) -> tuple[list[np.ndarray], np.ndarray]:
        """Per video, the reduction each decoded frame is decoded at (all 1 without ``scaled_decode``), and the
        views' boxes (B, V, 4) in the pixels of those frames (views.reduce_views)."""
        per_video = [reduce_views(p, self._hw(i), self.cfg.size, cell_size(self.cfg)) if self.scaled else
                     (np.ones(len(p.frames), np.int64), p.box) for i, _, p in drawn]
        for (_, _, p), (reduce, _) in zip(drawn, per_video):
            p.info["reduce"] = reduce  # per-video info: the reduction of each of ``frames``
        return [r for r, _ in per_video], np.stack([b for _, b in per_video])

    def _frames(self, drawn: list[tuple[int, bytes, ViewParams]], reduce: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """The views' frames: decoded (each at ``1 / reduce``) into ``raw`` (B, U, H, W, 3), or, with
        ``decode_on_device``, their JPEG bytes (``jpeg`` flat uint8, ``jpeg_offsets`` (N+1,), ``jpeg_count`` (B,),
        ``hw`` (B, 2)) for the GPU."""
        split = self.split
        idx = [d[0] for d in drawn]
        if self.cfg.decode_on_device:
            for pos, (i, payload, p) in enumerate(drawn):  # the GPU cannot skip a sample: check headers here
                try:
                    check_jpegs(payload, split.frame_offsets(i), p.frames, (int(split.height[i]), int(split.width[i])))
                except BadSample as e:
                    raise _DecodeFailed(pos, e) from None
            ranges = [(payload, int(fo[f]), int(fo[f + 1])) for i, payload, p in drawn
                      for fo in [split.frame_offsets(i)] for f in p.frames.tolist()]
            ends = np.cumsum([0] + [int(b - a) for _, a, b in ranges])
            flat = _empty((int(ends[-1]),), torch.uint8, self.ring, "jpeg")
            dst = flat.numpy()
            for (payload, a, b), at in zip(ranges, ends[:-1]):  # one copy, straight into shared memory
                dst[at : at + b - a] = np.frombuffer(payload, np.uint8, count=b - a, offset=a)
            return {"jpeg": flat, "jpeg_offsets": torch.from_numpy(ends),
                    "jpeg_count": torch.tensor([len(p.frames) for _, _, p in drawn]),
                    "hw": torch.from_numpy(np.stack([split.height[idx], split.width[idx]], 1))}
        hw = np.array([reduced_hw(self._hw(i), int(r.min())) for (i, _, _), r in zip(drawn, reduce)])  # largest
        shape = (len(drawn), max(len(d[2].frames) for d in drawn), int(hw[:, 0].max()), int(hw[:, 1].max()), 3)
        raw = _zeros(shape, self.ring) if self.augment_on_device else self._frame_buffer(shape)
        for pos, (i, payload, p) in enumerate(drawn):
            try:
                _decode_into(raw.numpy()[pos], payload, split.frame_offsets(i), p.frames, self._hw(i), reduce[pos])
            except BadSample as e:
                raise _DecodeFailed(pos, e) from None
        return {"raw": raw}

    def _frame_buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The default path's ``raw``: it never leaves the worker, so one buffer serves every batch (a fresh one,
        30-125 MB for K400 at 128-256 px, costs its page faults and the kernel's zeroing on every batch); its
        padding holds what earlier batches left there (nothing reads it)."""
        n = int(np.prod(shape))
        if self._scratch is None or self._scratch.size < n:
            self._scratch = None  # freed before the bigger one is made
            self._scratch = np.empty(n, np.uint8)
        return torch.from_numpy(self._scratch[:n].reshape(shape))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_scratch": None}  # a worker makes its own

    def _collate(self, drawn: list[tuple[int, bytes, ViewParams]], pool: DonorPool | None, bad: list) -> dict:
        split, cfg = self.split, self.cfg
        idx = [d[0] for d in drawn]
        params = [d[2] for d in drawn]
        reduce, boxes = self._reductions(drawn)
        batch = {k: torch.from_numpy(np.stack([getattr(p, k) for p in params])) for k in _STACKED}
        batch["box"] = torch.from_numpy(boxes)
        batch.update(self._frames(drawn, reduce))
        op_params = {k: np.stack([p.op_params[k] for p in params]) for k in APPEARANCE_OPS[cfg.appearance_op].params}
        batch["pool"] = self._pool(drawn, batch.get("raw"), pool, reduce, op_params)
        batch.update({k: torch.from_numpy(v) for k, v in op_params.items()})
        batch["appearance_op"] = cfg.appearance_op
        out = {"view_names": params[0].names, "roles": self.views.roles, "video_id": [str(split.video_id[i]) for i in idx],
               "index": torch.tensor(idx, dtype=torch.int64), "label": torch.from_numpy(split.label[idx]),
               "lam": batch["lam"], "bad": bad,
               "bytes": sum(len(d[1]) for d in drawn) + (pool.bytes_read if pool is not None else 0)}
        if self.augment_on_device:
            out.update(batch)
        else:
            b, v, t = batch["frame_index"].shape
            shared = _empty((b * v, t, cfg.size, cfg.size, 3), torch.uint8, self.ring, "views")
            views = apply_views(batch, cfg.size, quantize=True, out=shared)  # (B, V, T, S, S, 3) uint8
            out["views"] = views.permute(0, 1, 5, 2, 3, 4)  # (B, V, 3, T, S, S), channels-last memory
        out["info"] = [p.info for p in params]  # ~11 kB per K400 batch of 8: always sent (tests, benchmarks read it)
        return out

    def _pool(self, drawn: list[tuple[int, bytes, ViewParams]], raw: torch.Tensor | None, pool: DonorPool | None,
              reduce: list[np.ndarray], op_params: dict[str, np.ndarray]) -> torch.Tensor:
        """The batch's window pool (P, c, c, 3): the donor frames, then the windows an op whose ``source`` is ``own``
        reads from the videos themselves (e.g. RAD-intra), whose positions in ``op_params`` (B, V, ...) it replaces
        by their indices in the pool (ops.AppearanceOp)."""
        c = cell_size(self.cfg)
        parts = [pool.cells] if pool is not None else [torch.zeros((0, c, c, 3), dtype=torch.uint8)]
        op = APPEARANCE_OPS[self.cfg.appearance_op]
        if op.source != "own":
            return parts[0]
        base = len(parts[0])
        for key in op.pool_params:
            for b, (i, payload, p) in enumerate(drawn):
                windows = op_params[key][b]
                own = windows >= 0
                if not own.any():
                    continue
                parts.append(self._own_windows(b, i, payload, p, windows[own], raw, reduce[b], c))
                windows[own] = base + np.arange(int(own.sum()))
                base += int(own.sum())
        return torch.cat(parts)

    def _own_windows(self, b: int, i: int, payload: bytes, p: ViewParams, positions: np.ndarray,
                     raw: torch.Tensor | None, reduce: np.ndarray, c: int) -> torch.Tensor:
        """Video ``i``'s decoded frames ``positions`` (of ``p.frames``) at the window size: from ``raw`` (row ``b``),
        or, with ``decode_on_device``, decoded here."""
        if raw is not None:
            return _own_cells(raw[b], positions, reduce, self._hw(i), c)
        try:
            picked = torch.from_numpy(decode_frames(payload, self.split.frame_offsets(i), p.frames[positions]))
        except BadSample as e:
            raise _DecodeFailed(b, e) from None
        return resize_cells(picked, c)


def _own_cells(raw: torch.Tensor, positions: np.ndarray, reduce: np.ndarray, hw: tuple[int, int],
               cell: int) -> torch.Tensor:
    """RAD-intra windows: the video's decoded frames ``positions`` of ``raw`` (U, H, W, 3) (each at ``1 / reduce``
    of ``hw``, top left) resized to ``cell`` -> (N, cell, cell, 3), in the order of ``positions``."""
    out = torch.empty((len(positions), cell, cell, 3), dtype=torch.uint8)
    for r in np.unique(reduce[positions]).tolist():
        h, w = reduced_hw(hw, r)
        sel = np.flatnonzero(reduce[positions] == r)
        out[torch.from_numpy(sel)] = resize_cells(raw[torch.from_numpy(positions[sel]), :h, :w].contiguous(), cell)
    return out


class _DecodeFailed(Exception):
    def __init__(self, pos: int, reason: BadSample) -> None:
        super().__init__(str(reason))
        self.pos, self.reason = pos, reason


def _check_distributed(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        real_world, real_rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        if (world_size, rank) != (real_world, real_rank):
            raise ValueError(
                f"make_loader got rank={rank}, world_size={world_size} but the process group has "
                f"rank={real_rank}, world_size={real_world}; pass the group's rank and world size"
            )


def _passthrough(batch: dict[str, Any]) -> dict[str, Any]:
    return batch  # batches are collated in the workers


@dataclasses.dataclass
class _Epoch:
    """What the sampler sends with every batch index of a run loader: the epoch the batch belongs to."""

    epoch: int
    views: ViewPlan
    cfg: LoaderConfig
    end: int  # the epoch's last batch + 1 (no reads past it)


class _RunBatches(Dataset):
    """The dataset of a :class:`RunLoader`: item ``(epoch, j)`` is batch ``j`` of that epoch (its
    :class:`EpochBatches` built in the worker when the epoch changes: one permutation, milliseconds)."""

    def __init__(self, split: Split, per_rank: int, world: int, rank: int, recycle: bool) -> None:
        self.split, self.per_rank, self.world, self.rank = split, per_rank, world, rank
        self.ring = BufferRing() if recycle else None  # one per worker (forked with it), kept across epochs
        self._current: tuple[_Epoch, EpochBatches] | None = None

    def __getitem__(self, key: tuple[_Epoch, int]) -> dict[str, Any]:
        spec, j = key
        if self._current is None or self._current[0] != spec:
            plan = EpochPlan(len(self.split), self.per_rank, self.world, spec.cfg.seed, spec.epoch)
            self._current = spec, EpochBatches(self.split, spec.cfg, plan, spec.epoch, self.rank, views=spec.views,
                                               end=spec.end, ring=self.ring)
        return self._current[1][j]


class _Sampler:
    """The run loader's sampler: the batches ``start..end-1`` of the epoch :meth:`RunLoader.epoch` set last, as
    it was when the iteration began (a later :meth:`RunLoader.epoch` does not change a live iterator's batches)."""

    def __init__(self) -> None:
        self.spec, self.start = None, 0

    def __len__(self) -> int:
        return 0 if self.spec is None else self.spec.end - self.start

    def __iter__(self) -> Iterator[tuple[_Epoch, int]]:
        spec, start = self.spec, self.start
        return ((spec, j) for j in range(start, 0 if spec is None else spec.end))


class RunLoader:
    """The loader of a whole run, built ONCE: the manifest read and the shards checked once, the workers started
    at the first epoch and kept (``persistent_workers``) for the others; each epoch (or a resume at any step)
    only tells the sampler which batches come next. Pass it as ``data_dir`` to :func:`make_loader`."""

    def __init__(self, data: Location | Split, cfg: LoaderConfig, *, split: str = "train", batch_size: int,
                 rank: int = 0, world_size: int = 1, pin_memory: bool = False, recycle: bool | None = None) -> None:
        self.split = _open(data, cfg, split, rank, world_size)
        self.num_batches = EpochPlan(len(self.split), batch_size, world_size, cfg.seed, 0).num_batches
        self.batch_size, self.rank, self.world_size, self.pin_memory = batch_size, rank, world_size, pin_memory
        self.sampler = _Sampler()
        self.recycle = _recycle(pin_memory, recycle)
        ds = _RunBatches(self.split, batch_size, world_size, rank, self.recycle)
        self.loader = _data_loader(ds, self.sampler, cfg.workers, pin_memory, persistent=cfg.workers > 0)
        atexit.register(_stop_workers, weakref.ref(self.loader))  # runs before multiprocessing's exit handler

    def close(self) -> None:
        """Stop the kept workers now (they also stop when the loader is freed, or at exit)."""
        _stop_workers(weakref.ref(self.loader))

    def epoch(self, cfg: LoaderConfig, epoch: int, start: int, total: int, views: ViewPlan) -> DataLoader:
        """The DataLoader, set to give batches ``start..total-1`` of ``epoch`` (loader settings ``cfg``)."""
        _check_start(start, total)
        self.sampler.spec, self.sampler.start = _Epoch(epoch, views, cfg, total), start
        return self.loader


def _stop_workers(ref: weakref.ref) -> None:
    """Shut a kept-workers DataLoader's workers down the DataLoader's own way (a message, then join). At exit this
    must come before multiprocessing's handler, which SIGTERMs daemonic children (that workers ignore:
    :mod:`moquad.data.workers`) and joins them: a RunLoader alive at exit would hang the process."""
    loader = ref()
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
        loader._iterator = None


def _open(data: Location | Split, cfg: LoaderConfig, split: str, rank: int, world_size: int) -> Split:
    """The split a loader reads, its shards checked (once per loader), after checking rank and workers."""
    _check_distributed(rank, world_size)
    if cfg.workers < 0:
        raise ValueError(f"loader.workers must be >= 0, got {cfg.workers}")
    data = data if isinstance(data, Split) else Split(data, split)
    data.check_shards()
    return data


def _recycle(pin_memory: bool, recycle: bool | None) -> bool:
    """``recycle`` as asked, else on only where pinning really copies every batch out: the DataLoader pins only
    with an accelerator, and without one a caller who keeps batches (``list(loader)``) would hold reused buffers."""
    return pin_memory and torch.accelerator.is_available() if recycle is None else recycle


def _check_start(start: int, total: int) -> None:
    if not 0 <= start <= total:
        raise ValueError(f"start batch {start} outside the epoch's {total} batches")


class _Loader(DataLoader):
    """A DataLoader whose worker processes :func:`moquad.data.workers.end_workers` can end (and only those)."""

    def __iter__(self):  # noqa: ANN204 (DataLoader's iterator type is private)
        return track(super().__iter__())


def _data_loader(ds: Dataset, sampler: Any, workers: int, pin_memory: bool, persistent: bool) -> DataLoader:
    return _Loader(ds, batch_size=None, sampler=sampler, collate_fn=_passthrough, num_workers=workers,
                      pin_memory=pin_memory, persistent_workers=persistent,
                      prefetch_factor=PREFETCH if workers > 0 else None, worker_init_fn=ignore_preemption)


def make_loader(
    data_dir: str | Path | Split | RunLoader,
    cfg: LoaderConfig,
    *,
    split: str = "train",
    batch_size: int,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    start: int = 0,
    num_batches: int | None = None,
    pin_memory: bool = False,
    recycle: bool | None = None,
    views: ViewPlan | None = None,
) -> DataLoader:
    """A DataLoader of rank ``rank``'s batches ``start, start+1, ...`` of epoch ``epoch`` of a preprocessed
    dataset (``data_dir``: a folder of ``moquad preprocess``, or a ``moquad.Split`` of one).

    Epochs are exact: each holds ``videos // (batch_size * world_size)`` batches (``num_batches`` caps it
    lower) and uses each video at most once; the batches depend only on ``(cfg.seed, epoch)``, never on the
    number of workers, so a loop restarted at batch ``start`` sees the same batches.

    ``views``: the ``moquad.ViewPlan`` of every video (default ``moquad.quadruple_views(cfg)``; the warm-up
    task: ``moquad.speed_pair_views(cfg)``). ``recycle`` (default: on when ``pin_memory`` really pins, i.e. with
    an accelerator): workers reuse their shared batch buffers; only for a consumer that copies each batch out
    before asking for the next.

    A batch is a dict: ``views`` uint8 (B, V, 3, T, H, W) (with ``cfg.augment_on_device``: ``raw`` frames and
    the view parameters that ``moquad.to_model`` turns into views), ``view_names``, ``roles`` (the plan's: what
    the loss reads), ``video_id``, ``index`` int64 (B,) (the manifest row, the identity the losses mask by),
    ``label`` int64 (B,), ``lam`` float32 (B, V), ``bad`` (samples that failed to read or decode, each replaced
    by a spare video), ``bytes`` (read for this batch) and per-video ``info`` (dilations, frame indices,
    donor ids). ``data_dir`` may also be the trainer's own loader of a run, which keeps its workers across
    epochs; the batches are the same.
    """
    views = views or quadruple(cfg)
    check_config(cfg, views)
    recycle = _recycle(pin_memory, recycle)
    if isinstance(data_dir, RunLoader):
        run = data_dir
        got, built = (batch_size, rank, world_size, pin_memory, recycle), \
            (run.batch_size, run.rank, run.world_size, run.pin_memory, run.recycle)
        if got != built:
            raise ValueError(f"make_loader got (batch_size, rank, world_size, pin_memory, recycle) = {got}; its "
                             f"RunLoader was built with {built}")
        total = run.num_batches if num_batches is None else min(num_batches, run.num_batches)
        return run.epoch(cfg, epoch, start, total, views)
    data = _open(data_dir, cfg, split, rank, world_size)
    plan = EpochPlan(len(data), batch_size, world_size, cfg.seed, epoch)
    total = plan.num_batches if num_batches is None else min(num_batches, plan.num_batches)
    _check_start(start, total)
    ring = BufferRing() if recycle else None  # each worker forks its own
    ds = EpochBatches(data, cfg, plan, epoch, rank, views=views, end=total, ring=ring)
    return _data_loader(ds, range(start, total), min(cfg.workers, total - start), pin_memory, persistent=False)
