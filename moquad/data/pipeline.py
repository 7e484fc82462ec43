"""Streaming loader: webdataset stages from tar shards to batches of views (used by pretrain).

Stages, per DataLoader worker of each rank::

    shard list -> shuffle(seed, epoch) -> split_by_node -> split_by_worker -> tar samples
      -> sample shuffle buffer -> views (+ cross-shard donor pool) -> batch

- Shuffle: the shard order is a permutation drawn from ``(seed, epoch)``, identical on every rank,
  so the round-robin node split gives each rank a disjoint set of shards (hence of videos); the
  sample buffer, clip starts and augmentations use ``(seed, epoch, rank, worker)``. New epoch, new
  order; same ``(seed, epoch, world_size, workers)``, same batches.
- Equal length: each rank yields exactly ``num_batches`` batches (default
  :func:`batches_per_epoch`, the same on every rank). A worker cycles over its shards (each pass
  in a new order) until it has produced its share, like webdataset's ``with_epoch``; worker ``w``
  makes ``num_batches // W (+1 if w < num_batches % W)`` and the DataLoader interleaves them.
- Balance: all workers make (almost) the same number of batches; with unequal shards a worker with
  fewer videos starts its next pass early, so within one epoch some videos can appear twice and
  others not at all (as with ``with_epoch``); the shuffle buffer also mixes consecutive passes.
- Tar samples: read by :func:`tar_samples` (webdataset's grouping rule, one read per member).
- Few shards: with fewer shards than ``world_size * workers`` the same node/worker split is done
  per VIDEO instead (every consumer reads all shards and keeps its videos, positions drawn from
  ``(seed, epoch)`` over the manifest): still disjoint, but each shard is read by every consumer;
  write more shards (smaller ``--shard-size``) for big runs.
- ``augment_on_device``: the views stage only draws parameters and the batch stage decodes the
  frames into the batch (:mod:`moquad.data.raw`); the pixels are augmented on the accelerator by
  ``moquad.data.augment.device_augment``. The tar stage then leaves the ``.jpgs`` payload unread
  and the workers read just the frames their clips use.
- Multi-node safety: when a torch.distributed group is initialised, ``world_size``/``rank`` must
  match it (a loader built without them would silently duplicate data on every rank).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from moquad.config import LoaderConfig
from moquad.data.disturb import cell_size
from moquad.data.donors import DonorPool, donor_stream
from moquad.data.raw import collate_raw, raw_views
from moquad.data.tarread import tar_members
from moquad.data.views import check_config, make_views, needs_donor_pool

log = logging.getLogger(__name__)


def list_shards(data_dir: str | Path, split: str) -> list[str]:
    """Sorted shard paths of ``split`` (``DIR/shards/{split}-*.tar``)."""
    data_dir = Path(data_dir)
    shards = sorted((data_dir / "shards").glob(f"{split}-*.tar"))
    if not shards:
        raise FileNotFoundError(
            f"no shards for split {split!r} in {data_dir / 'shards'}; run `moquad preprocess ... --out {data_dir}` first"
        )
    return [str(p) for p in shards]


def num_videos(data_dir: str | Path, split: str) -> int:
    """Number of videos in ``split`` (from dataset.json, else the manifest)."""
    data_dir = Path(data_dir)
    info = data_dir / "dataset.json"
    if info.is_file():
        count = json.loads(info.read_text()).get("splits", {}).get(split)
        if isinstance(count, int):
            return count
    return len(_video_ids(data_dir, split))


def _video_ids(data_dir: Path, split: str) -> list[str]:
    import pyarrow.parquet as pq

    path = Path(data_dir) / "manifests" / f"{split}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"manifest {path} not found; run `moquad preprocess` (or `moquad verify {data_dir}`)")
    return sorted(str(v) for v in pq.read_table(path, columns=["video_id"]).column("video_id").to_pylist())


def batches_per_epoch(data_dir: str | Path, split: str, global_batch: int) -> int:
    """Batches per rank per epoch: ``videos // global_batch`` (at least 1); the same on every rank."""
    if global_batch < 1:
        raise ValueError(f"batch size must be >= 1, got {global_batch}")
    return max(1, num_videos(data_dir, split) // global_batch)


# ---------------------------------------------------------------- stages


def shard_list(shards: Sequence[str], seed: int, epoch: int) -> Iterator[dict[str, Any]]:
    """Shard list + shuffle(seed, epoch), cycled forever.

    Each item carries ``pos``, its place in the epoch's permutation (same on every rank), which the
    splitters use; every further pass visits the shards in a new order.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(len(shards))
    items = [(str(shards[i]), pos) for pos, i in enumerate(perm)]
    for p in itertools.count():
        order = range(len(items)) if p == 0 else np.random.default_rng([seed, epoch, 1, p]).permutation(len(items))
        for j in order:
            url, pos = items[j]
            yield {"url": url, "pos": pos}


def split_by_node(src: Iterator[dict], rank: int, world_size: int) -> Iterator[dict]:
    """Keep items whose ``pos`` is ``rank`` modulo ``world_size`` (round robin over ranks)."""
    for item in src:
        if item["pos"] % world_size == rank:
            yield item


def split_by_worker(src: Iterator[dict], worker: int, num_workers: int, world_size: int) -> Iterator[dict]:
    """Keep the rank's items assigned to this DataLoader worker (round robin over workers)."""
    for item in src:
        if (item["pos"] // world_size) % num_workers == worker:
            yield item


def tag_video_position(src: Iterator[dict], positions: dict[str, int]) -> Iterator[dict]:
    """Per-video split (few shards): give each sample ``pos`` = its video's place in the epoch order."""
    misses = 0
    for sample in src:
        vid = str(json.loads(sample["json"])["video_id"])
        if vid in positions:
            misses = 0
            sample["pos"] = positions[vid]
            yield sample
        else:
            misses += 1
            if misses > 10 * len(positions) + 100:
                raise ValueError("shards do not match the manifest; run `moquad verify DIR`")


def tar_samples(src: Iterator[dict], lazy: tuple[str, ...] = ()) -> Iterator[dict]:
    """Stage: shard items ``{"url", "pos"}`` -> samples ``{"__key__", "__url__", "json", "jpgs", "pos"}``.

    Same grouping as ``wds.tarfile_to_samples`` (files sharing a key before the first dot), but the
    shard is opened seekable so each member is read with ONE read call instead of the streaming
    reader's 10 KB chunks (8x less CPU per video, which matters next to ~60 JPEG decodes), and the
    headers are parsed by :func:`moquad.data.tarread.tar_members` (10x less than ``tarfile``).
    Incomplete samples (no ``.json`` or no ``.jpgs``) are skipped. Members whose extension is in
    ``lazy`` are not read: the sample holds ``(shard path, byte offset, size)`` instead (the
    ``augment_on_device`` workers then read only the frames their clips use).
    """
    for item in src:
        url = item["url"]
        with open(url, "rb") as f:
            current: dict[str, Any] | None = None
            for name, offset, size in tar_members(f, url):
                key, _, ext = name.rpartition("/")[2].partition(".")
                if current is not None and current["__key__"] != key:
                    if "json" in current and "jpgs" in current:
                        yield current
                    current = None
                if current is None:
                    current = {"__key__": key, "__url__": url, "pos": item["pos"]}
                if ext in lazy:
                    current[ext] = (url, offset, size)
                else:
                    f.seek(offset)
                    current[ext] = f.read(size)
            if current is not None and "json" in current and "jpgs" in current:
                yield current


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """List of per-video views -> the batch dict of the loader contract."""
    views = torch.stack([s["views"].permute(0, 2, 3, 4, 1) for s in samples])  # channels-last memory
    batch = {
        "views": views.permute(0, 1, 5, 2, 3, 4),
        "view_names": samples[0]["names"],
        "video_id": [s["video_id"] for s in samples],
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "lam": torch.from_numpy(np.stack([s["lam"] for s in samples])),
    }
    if "colour" in samples[0]:
        batch["colour"] = torch.stack([s["colour"] for s in samples])
    if "info" in samples[0]:
        batch["info"] = [s["info"] for s in samples]
    return batch


class ViewStream(IterableDataset):
    """One rank's stream of batches (exactly ``num_batches``, shared over the DataLoader workers)."""

    def __init__(
        self,
        shards: Sequence[str],
        cfg: LoaderConfig,
        *,
        batch_size: int,
        epoch: int,
        rank: int,
        world_size: int,
        num_batches: int,
        positions: dict[str, int] | None = None,
        debug: bool = False,
        colour_on_device: bool = False,
        augment_on_device: bool = False,
    ) -> None:
        self.shards, self.cfg, self.batch_size = list(shards), cfg, batch_size
        self.epoch, self.rank, self.world_size, self.num_batches = epoch, rank, world_size, num_batches
        self.positions = positions  # None: split by shard; else per video
        self.debug = debug
        self.colour_on_device = colour_on_device
        self.augment_on_device = augment_on_device

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        count = self.num_batches // workers + (worker < self.num_batches % workers)
        if count == 0:
            return iter(())
        cfg = self.cfg
        seeds = np.random.SeedSequence([cfg.seed, self.epoch, self.rank, worker]).generate_state(3)
        rng = np.random.default_rng(seeds[0])
        node = partial(split_by_node, rank=self.rank, world_size=self.world_size)
        by_worker = partial(split_by_worker, worker=worker, num_workers=workers, world_size=self.world_size)
        stages: list[Any] = [partial(shard_list, self.shards, cfg.seed, self.epoch)]
        samples = partial(tar_samples, lazy=("jpgs",) if self.augment_on_device else ())
        if self.positions is None:
            stages += [node, by_worker, samples]
        else:
            stages += [samples, partial(tag_video_position, positions=self.positions), node, by_worker]
        pool = None
        if needs_donor_pool(cfg):  # independent stream, its own shard order (seed), over ALL shards
            donors = donor_stream(shard_list(self.shards, int(seeds[2]), self.epoch), np.random.default_rng(seeds[2]))
            pool = DonorPool(donors, cfg.donor_pool, cell_size(cfg.size, cfg.rad_k))
        buffer = max(1, cfg.shuffle_buffer)
        stages += [
            wds.shuffle(buffer, initial=buffer, rng=random.Random(int(seeds[1]))),
            wds.map(partial(self._views, rng=rng, pool=pool)),
            wds.batched(self.batch_size, collation_fn=collate_raw if self.augment_on_device else collate, partial=False),
        ]
        return itertools.islice(iter(wds.DataPipeline(*stages)), count)

    def _views(self, sample: dict[str, Any], rng: np.random.Generator, pool: DonorPool | None) -> dict[str, Any]:
        meta = json.loads(sample["json"])
        if self.augment_on_device:
            out = raw_views(meta, sample["jpgs"], self.cfg, rng, donors=pool)
        else:
            out = make_views(meta, sample["jpgs"], self.cfg, rng, donors=pool, colour_on_device=self.colour_on_device)
        if pool is not None:
            pool.pull(1)  # keep the pool fresh: one donor video per sample
        info = out.pop("info")
        out["video_id"] = str(meta["video_id"])
        out["label"] = int(meta.get("label", -1))
        if self.debug:
            out["info"] = info
        return out


def _passthrough(batch: dict[str, Any]) -> dict[str, Any]:
    return batch  # batches are collated in the workers; keep tuples/lists as they are


def _check_distributed(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        real_world, real_rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        if (world_size, rank) != (real_world, real_rank):
            raise ValueError(
                f"make_loader got rank={rank}, world_size={world_size} but the process group has "
                f"rank={real_rank}, world_size={real_world}; pass the group's rank and world size "
                "(without a node split every rank would read the same videos)"
            )


def make_loader(
    data_dir: str | Path,
    cfg: LoaderConfig,
    *,
    split: str = "train",
    batch_size: int,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    num_batches: int | None = None,
    pin_memory: bool = False,
    debug: bool = False,
    colour_on_device: bool | None = None,
    augment_on_device: bool | None = None,
) -> DataLoader:
    """DataLoader of batches for one rank and one epoch (see the module docstring).

    Batches: ``views`` uint8 (B, V, 3, T, H, W), ``view_names``, ``video_id``, ``label`` int64 (B,),
    ``lam`` float32 (B, V). ``len(loader) == num_batches``. ``debug`` adds per-video ``info``
    (frame indices, dilations, donor video ids). ``colour_on_device`` (default: the config's
    ``colour_on_device`` if it has one, else False) skips the colour jitter in the workers and adds
    ``colour`` float32 (B, V, 3, 4) for ``normalize(views, device, colour=batch.get("colour"))``:
    ~1.5x more quadruples per worker on CPU, the colour work moves to the accelerator.
    ``augment_on_device`` (default: the config's ``augment_on_device``, else False): the workers only
    decode and draw parameters; batches carry ``raw`` frames and per-clip parameters instead of
    ``views`` (:mod:`moquad.data.raw`) and ``moquad.data.augment.device_augment(batch, device, cfg.size)``
    builds the normalised views on the accelerator (implies ``colour_on_device``).
    """
    check_config(cfg)
    _check_distributed(rank, world_size)
    if colour_on_device is None:
        colour_on_device = bool(getattr(cfg, "colour_on_device", False))
    if augment_on_device is None:
        augment_on_device = bool(getattr(cfg, "augment_on_device", False))
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if cfg.workers < 0:
        raise ValueError(f"loader.workers must be >= 0, got {cfg.workers}")
    shards = list_shards(data_dir, split)
    if num_batches is None:
        num_batches = batches_per_epoch(data_dir, split, batch_size * world_size)
    workers = cfg.workers
    positions = None
    if len(shards) < world_size * max(1, workers):
        ids = _video_ids(Path(data_dir), split)
        if len(ids) < world_size:
            raise ValueError(f"split {split!r} has {len(ids)} videos, fewer than world_size={world_size}")
        workers = min(workers, len(ids) // world_size)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(ids))
        positions = {ids[i]: pos for pos, i in enumerate(order)}
        log.info(
            "split %s has %d shards for %d ranks x %d workers: splitting per video (every worker reads every "
            "shard); preprocess with a smaller --shard-size for large runs", split, len(shards), world_size, workers,
        )
    stream = ViewStream(
        shards, cfg, batch_size=batch_size, epoch=epoch, rank=rank, world_size=world_size,
        num_batches=num_batches, positions=positions, debug=debug, colour_on_device=colour_on_device,
        augment_on_device=augment_on_device,
    )
    return DataLoader(
        stream,
        batch_size=None,
        collate_fn=_passthrough,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        prefetch_factor=2 if workers > 0 else None,
    )
