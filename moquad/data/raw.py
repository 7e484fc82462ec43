"""Worker side of ``augment_on_device``: decode the frames, draw the parameters, let the accelerator augment.

With ``LoaderConfig.augment_on_device`` a DataLoader worker only reads the tar sample, draws every
random parameter of every clip, in the same order and with the same functions as the CPU path
(:func:`moquad.data.views.render_views`), so a seed gives the same clips, crops, flips, colour
operations, lambdas and donors on both paths, and decodes the distinct frames the video's views
use -- straight into the batch (:func:`collate_raw`; simplejpeg as ``frames.decode_jpeg``, with its
output buffer), so a frame is written once, by libjpeg-turbo, and never copied again (into shared memory inside a DataLoader worker, as torch's ``default_collate``
allocates, so handing the batch to the main process copies nothing either). Per clip it ships:

  - ``frame_index`` (T,): the clip's frames as indices into the video's decoded frames,
  - ``box`` (top, left, height, width) of the random resized crop in source pixels, ``flip``,
  - ``colour_ops`` / ``colour_factors`` (5,): the colour operations in order (codes of
    ``augment.COLOUR_OPS``, 0 = none): the device composes them into ``[M | b]`` with
    ``augment.colour_affine_batch`` (contrast needs the clip's mean colour, which the device takes
    from the resized crop exactly as the CPU path does; composing 3x3 matrices in numpy costs a
    worker more than the rest of the parameters together),
  - ``cells``: RAD's ``k * k`` donor windows uint8 (k*k, c, c, 3) as the donor pool stores them
    (zeros when not disturbed; the worker keeps only the disturbed views' and writes them into the batch); the device tiles them into ``D`` and resizes it to the crop size
    exactly like ``disturb.rad_noise`` (shipping ``D`` instead would cost the worker one mosaic
    and one antialiased resize per disturbed clip for the same number of bytes),
  - ``noise_frame``: BE's frame (an index into the clip, ``-1`` otherwise): BE's ``D`` is a frame
    of the augmented clip itself, so the device takes it after augmenting,
  - ``lam`` (0 when not disturbed).

The batch's ``raw`` uint8 (B, F, H, W, 3) holds each video's distinct frames (``frame_index``
points into them) zero padded to the batch's largest frame count and frame size (videos differ in
size and aspect); crops never read the padding. :func:`moquad.data.augment.device_augment` turns
the batch into normalised views on the accelerator.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import simplejpeg
import torch
from torch.utils.data import get_worker_info

from moquad.config import LoaderConfig
from moquad.data.augment import MAX_COLOUR_OPS, colour_codes, sample_aug
from moquad.data.disturb import cell_size, draw_lambda, resize_donors
from moquad.data.donors import DonorPool
from moquad.data.views import plan_views

READ_GAP = 16384  # bytes: frames closer than this are read together (one pread)
RAW_KEYS = ("raw", "frame_index", "box", "flip", "colour_ops", "colour_factors", "cells", "noise_frame", "lam")


def raw_views(
    meta: dict[str, Any],
    jpgs: bytes | tuple[str, int, int],
    cfg: LoaderConfig,
    rng: np.random.Generator,
    donors: DonorPool | None = None,
) -> dict[str, Any]:
    """One video for ``augment_on_device``: the per-clip parameters of :func:`raw_params`, ``names``,
    ``lam``, ``info`` (as ``make_views``) and what :func:`collate_raw` decodes: ``chunks``, the JPEG
    bytes of the distinct frames (:func:`frame_bytes`), and their ``hw`` (from the first one's header)."""
    offsets = meta["frame_offsets"]
    plan, dilations = plan_views(len(offsets) - 1, cfg, rng)
    unique = np.unique(np.concatenate([idx for _, idx, _ in plan]))
    chunks = frame_bytes(jpgs, offsets, unique)
    height, width = simplejpeg.decode_jpeg_header(chunks[0])[:2]
    out = raw_params(plan, unique, (height, width), str(meta["video_id"]), cfg, rng, donors)
    out.update(chunks=chunks, hw=(height, width))
    out["info"]["dilations"] = dilations
    return out


def raw_params(
    plan: list,
    unique: np.ndarray,
    hw: tuple[int, int],
    video_id: str,
    cfg: LoaderConfig,
    rng: np.random.Generator,
    donors: DonorPool | None = None,
) -> dict[str, Any]:
    """Draw the planned clips' parameters for frames of ``hw`` = (height, width) (same draws, same order
    as ``views.render_views``). RAD-inter's windows are returned as ``cells`` {view: (k*k, c, c, 3)};
    RAD-intra's are frames of the video itself: their positions in ``unique`` are returned as
    ``intra_pick`` {view: (k*k,)} and resized after decoding."""
    height, width = hw
    k, size = cfg.rad_k, cfg.size
    cell = cell_size(size, k)
    nv, t = len(plan), len(plan[0][1])
    frame_index = np.empty((nv, t), dtype=np.int64)
    box = np.empty((nv, 4), dtype=np.int64)
    flip = np.zeros(nv, dtype=bool)
    colour_ops = np.zeros((nv, MAX_COLOUR_OPS), dtype=np.int64)
    colour_factors = np.zeros((nv, MAX_COLOUR_OPS), dtype=np.float32)
    cells: dict[int, torch.Tensor] = {}  # RAD-inter windows per disturbed view (the rest stay zero)
    noise_frame = np.full(nv, -1, dtype=np.int64)
    lams, donor_ids, intra_pick = np.zeros(nv, dtype=np.float32), [], {}
    for v, (_name, idx, disturbed) in enumerate(plan):
        aug = sample_aug(height, width, cfg, rng)
        frame_index[v] = np.searchsorted(unique, idx)
        box[v] = aug.top, aug.left, aug.height, aug.width
        flip[v] = aug.flip
        if aug.colour:
            colour_ops[v], colour_factors[v] = colour_codes(aug.colour)
        ids: list[str] = []
        if disturbed and cfg.appearance_op != "none":
            lams[v] = draw_lambda(rng, cfg.rad_lambda)
            if cfg.appearance_op == "be":
                noise_frame[v] = int(rng.integers(0, t))
                ids = [video_id]
            elif cfg.appearance_op == "rad_intra":
                intra_pick[v] = rng.integers(0, len(unique), size=k * k)
                ids = [video_id] * (k * k)
            else:
                if donors is None:
                    raise ValueError("appearance_op=rad_inter needs a donor pool")
                cells[v], ids = donors.draw(k * k, video_id, rng)
        donor_ids.append(ids)
    return {
        "frame_index": frame_index,
        "box": box,
        "flip": flip,
        "colour_ops": colour_ops,
        "colour_factors": colour_factors,
        "cells": cells,
        "cells_shape": (nv, k * k, cell, cell, 3),
        "intra_pick": intra_pick,
        "noise_frame": noise_frame,
        "names": tuple(name for name, _, _ in plan),
        "lam": lams,
        "info": {"indices": [idx for _, idx, _ in plan], "donor_ids": donor_ids},
    }


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised tensor, in shared memory inside a DataLoader worker (no copy when it is sent)."""
    if get_worker_info() is None:  # numpy's allocator reuses big blocks: no page faults per batch
        return torch.from_numpy(np.empty(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))
    numel = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def frame_bytes(jpgs: bytes | tuple[str, int, int], offsets: list[int], unique: np.ndarray) -> list:
    """JPEG bytes of frames ``unique`` (sorted, distinct) of one video.

    ``jpgs`` is the ``.jpgs`` payload, or ``(shard path, payload offset, size)`` when the tar stage
    left it unread (``tar_samples(lazy=("jpgs",))``): then only the needed frames are read, with one
    ``pread`` per run of frames less than :data:`READ_GAP` bytes apart -- a video's whole payload is
    ~5x the bytes its clips use.
    """
    n = len(offsets) - 1
    if len(unique) and not (0 <= unique[0] and unique[-1] < n):
        raise IndexError(f"frames {unique[0]}..{unique[-1]} out of range for a video of {n} frames")
    idx = unique.tolist()
    if not isinstance(jpgs, tuple):
        view = memoryview(jpgs)
        return [view[offsets[i] : offsets[i + 1]] for i in idx]
    path, base, size = jpgs
    if offsets[-1] != size:
        raise ValueError(f"{path}: frame offsets do not match the payload size; run `moquad verify`")
    chunks: list = []
    with open(path, "rb", buffering=0) as f:
        start = 0
        while start < len(idx):
            end = start + 1
            while end < len(idx) and offsets[idx[end]] - offsets[idx[end - 1] + 1] <= READ_GAP:
                end += 1
            lo, hi = offsets[idx[start]], offsets[idx[end - 1] + 1]
            data = memoryview(os.pread(f.fileno(), hi - lo, base + lo))
            if len(data) != hi - lo:
                raise ValueError(f"{path} is truncated; run `moquad verify` and re-run `moquad preprocess`")
            chunks += [data[offsets[i] - lo : offsets[i + 1] - lo] for i in idx[start:end]]
            start = end
    return chunks


def decode_into(out: np.ndarray, chunks: list, hw: tuple[int, int]) -> None:
    """Decode one video's frames (JPEG ``chunks``) into ``out`` uint8 (>= U, >= H, >= W, 3); zero the rest.

    A frame as wide as ``out`` is decoded in place (its rows are contiguous there); a narrower one
    is decoded, then copied.
    """
    height, width = hw
    for j, data in enumerate(chunks):
        if width == out.shape[2]:
            frame = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out[j])
        else:
            frame = simplejpeg.decode_jpeg(data, colorspace="RGB")
            out[j, : frame.shape[0], : frame.shape[1]] = frame
        if frame.shape[:2] != (height, width):
            raise ValueError(f"a video has frames of {frame.shape[1]}x{frame.shape[0]} and {width}x{height} "
                             "pixels; frames of a video must have one size: re-run `moquad preprocess`")
    u = len(chunks)
    out[u:] = 0
    out[:u, height:] = 0
    out[:u, :height, width:] = 0


def collate_raw(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-video raw views -> a batch for ``device_augment`` (keys :data:`RAW_KEYS` + the loader contract's
    ``view_names``, ``video_id``, ``label``; no ``views``); decodes the frames into ``raw``."""

    def stack(key: str) -> torch.Tensor:
        return torch.from_numpy(np.stack([s[key] for s in samples]))

    shape = (max(len(s["chunks"]) for s in samples), max(s["hw"][0] for s in samples),
             max(s["hw"][1] for s in samples), 3)
    raw = _empty((len(samples), *shape), torch.uint8)
    cells = _empty((len(samples), *samples[0]["cells_shape"]), torch.uint8)
    frames, windows = raw.numpy(), cells.numpy()
    windows.fill(0)
    for i, s in enumerate(samples):
        decode_into(frames[i], s["chunks"], s["hw"])
        for v, window in s["cells"].items():
            windows[i, v] = window.numpy()
        h, w = s["hw"]
        for v, pick in s["intra_pick"].items():  # RAD-intra: windows from the video's own frames
            windows[i, v] = resize_donors(torch.from_numpy(frames[i, pick, :h, :w]), cells.shape[3]).numpy()
    batch = {
        "raw": raw,
        "frame_index": stack("frame_index"),
        "box": stack("box"),
        "flip": stack("flip"),
        "colour_ops": stack("colour_ops"),
        "colour_factors": stack("colour_factors"),
        "cells": cells,
        "noise_frame": stack("noise_frame"),
        "lam": stack("lam"),
        "view_names": samples[0]["names"],
        "video_id": [s["video_id"] for s in samples],
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
    }
    if "info" in samples[0]:
        batch["info"] = [s["info"] for s in samples]
    return batch
