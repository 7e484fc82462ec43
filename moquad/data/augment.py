"""Pixels from :class:`~moquad.data.views.ViewParams`: ONE implementation, in the workers or on the GPU.

:func:`apply_views` turns a batch of decoded frames and the batch's view parameters into the views.
The DataLoader workers call it (default) and ship uint8 views; with ``augment_on_device`` the workers
ship the frames and parameters and the training loop calls the same function on the accelerator
(:func:`to_model`). Per clip, in this order:

1. crop the box, resize to ``size`` x ``size`` (bilinear, antialiased, ``align_corners=False``), flip;
2. colour map ``clamp(M @ rgb + b, 0, 255)``: every SimCLR colour op (brightness, contrast,
   saturation, hue as a rotation about the grey axis in YIQ, grayscale) is affine in RGB, so a clip's
   ops compose into ONE 3x3 matrix plus bias (:func:`colour_matrices`; contrast blends towards the
   mean grey of the already transformed clip, taken on a 4 x 8 x 8 time x height x width subsample);
   unlike torchvision, values are clamped once at the end rather than after each op;
3. appearance disturbance ``(1 - lam) * V + lam * D``: the batch's appearance op
   (``moquad.data.ops.APPEARANCE_OPS``) makes ``D``: the RAD mosaic of the view's ``k * k`` donor windows
   resized once to ``size`` (RAD-inter and RAD-intra), or one frame of the clip itself after step 2 (BE).
   The same ``D`` on every frame: temporal differences are only scaled.

The two paths differ only in number representation and kernels. On the CPU step 1 reads and writes uint8
(numpy gathers the box of the clip's frames, torch's fast antialiased uint8 kernel resizes, so step 1
rounds; OpenCV flips), step 2 is float32 (``cv2.transform``: one multiply-add per value; OpenCV's own
uint8 map is fixed point, up to 0.7 levels off, so the clip is converted first), step 3 float32 with the RAD
mosaic resized by the same uint8 kernel (``ops.rad_mosaic``: D within 1 grey level of the float resize, a view
within ``lam`` levels), and the worker rounds the result half up to uint8 for transport (the +0.5 folded into
the last float step, the cast truncates): the only rounding after steps 1 and 3's mosaic. On CUDA everything
stays float32 (step 2 a 1 x 1 convolution); same parameters, pixels within about 1 grey level of the workers'
(tests/test_gpu.py). Given D, a clip with no colour op is the same bits as the torch-only CPU path before
OpenCV, a coloured one within 1 level where float32 rounding straddled a .5 (tests/test_augment_uint8.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from moquad.data.ops import APPEARANCE_OPS

# torchvision's Kinetics-400 statistics (used by its r3d_18 / r2plus1d_18 / s3d weights)
MEAN = (0.43216, 0.394666, 0.37645)
STD = (0.22803, 0.22145, 0.216989)
_GRAY = (0.299, 0.587, 0.114)
_TAIL = 64  # pixels of padding after a clip for cv2.transform: every real pixel takes its SIMD path
_RGB2YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
_RGB2YIQ_32 = torch.tensor(_RGB2YIQ, dtype=torch.float64).to(torch.float32)
_YIQ2RGB_32 = torch.linalg.inv(torch.tensor(_RGB2YIQ, dtype=torch.float64)).to(torch.float32)  # inverted once
# what apply_views reads from a batch, besides the appearance op's own parameters (ops.AppearanceOp.params)
PARAM_KEYS = ("raw", "frame_index", "box", "flip", "colour_ops", "colour_factors", "lam", "pool", "appearance_op")


def colour_matrices(codes: torch.Tensor, factors: torch.Tensor, mean_rgb: torch.Tensor) -> torch.Tensor:
    """Colour ops in order: codes int (N, K), factors (N, K), clip means (N, 3) -> ``[M | b]`` (N, 3, 4).

    Codes index ``views.COLOUR_OPS``: 0 none, 1 brightness, 2 contrast, 3 saturation, 4 hue, 5 gray.
    """
    n, dev = codes.shape[0], codes.device
    eye = torch.eye(3, device=dev).expand(n, 3, 3)
    gray = torch.tensor(_GRAY, dtype=torch.float32, device=dev)
    to_gray = torch.ones(3, 1, device=dev) * gray  # every row: the grey weights
    rgb2yiq, yiq2rgb = _RGB2YIQ_32.to(dev), _YIQ2RGB_32.to(dev)
    m, b = eye.clone(), torch.zeros(n, 3, device=dev)
    mean_rgb = mean_rgb.to(torch.float32)
    for i in range(codes.shape[1]):
        code, v = codes[:, i, None, None], factors[:, i, None, None].to(torch.float32)
        c, s = torch.cos(2 * math.pi * v[:, 0, 0]), torch.sin(2 * math.pi * v[:, 0, 0])
        rot = torch.zeros(n, 3, 3, device=dev)
        rot[:, 0, 0], rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = 1, c, -s, s, c
        step = torch.where((code == 1) | (code == 2), v * eye, eye)
        step = torch.where(code == 3, v * eye + (1 - v) * to_gray, step)
        step = torch.where(code == 4, yiq2rgb @ rot @ rgb2yiq, step)
        step = torch.where(code == 5, to_gray.expand(n, 3, 3), step)
        grey = ((m @ mean_rgb[:, :, None])[:, :, 0] + b) @ gray  # (N,) mean grey of the clip so far
        shift = torch.where(code[:, :, 0] == 2, (1 - v[:, :, 0]) * grey[:, None], torch.zeros_like(b[:, :1]))
        m, b = step @ m, (step @ b[:, :, None])[:, :, 0] + shift
    return torch.cat([m, b[:, :, None]], dim=2)


def _cv2():
    """OpenCV, imported on first use (the CPU path only), its thread count following torch's (one in a worker)."""
    import cv2

    if cv2.getNumThreads() != torch.get_num_threads():
        cv2.setNumThreads(torch.get_num_threads())
    return cv2


def crop_resize(frames: torch.Tensor, index: torch.Tensor, box: list[int], flip: bool, size: int) -> torch.Tensor:
    """One clip: frames (U, H, W, 3) -> contiguous (T, size, size, 3): uint8 on the CPU (uint8 stays uint8), float
    on CUDA. On the CPU the box of the T frames is gathered by numpy (one copy; torch's advanced indexing with
    slices is ~10x slower) and the flip is OpenCV's (one call for the clip, ~2x torch's)."""
    top, left, h, w = box
    cpu = frames.device.type == "cpu"
    if cpu:
        x = torch.from_numpy(frames.numpy()[index.numpy(), top : top + h, left : left + w])  # (T, h, w, 3)
    else:
        x = frames.index_select(0, index)[:, top : top + h, left : left + w]
    x = x.permute(0, 3, 1, 2)  # channels-last memory: the layout the fast kernels want
    if not cpu or x.dtype != torch.uint8:
        x = x.float()
    if (h, w) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    x = x.permute(0, 2, 3, 1).contiguous()
    if flip and cpu:  # each row of the (T * size, size) image reversed: every frame mirrored
        return torch.from_numpy(_cv2().flip(x.numpy().reshape(-1, size, 3), 1)).view(x.shape)
    return x.flip(2) if flip else x


def _crops(batch: dict, size: int) -> list[torch.Tensor]:
    """Step 1 for every clip of the batch -> B*V clips (T, S, S, 3): uint8 on the CPU, float32 on CUDA."""
    raw, index = batch["raw"], batch["frame_index"].to(batch["raw"].device)
    b, v, t = index.shape
    boxes, flips = batch["box"].tolist(), batch["flip"].tolist()
    return [crop_resize(raw[i], index[i, j], boxes[i][j], flips[i][j], size) for i in range(b) for j in range(v)]


def _colour_maps(clips: list[torch.Tensor], codes: torch.Tensor, factors: torch.Tensor, sel: list[int]) -> torch.Tensor:
    """``[M | b]`` (len(sel), 3, 4) of the clips ``sel`` (one batched composition for the whole batch)."""
    mean = torch.stack([clips[i][::4, ::8, ::8].reshape(-1, 3).float().mean(0) for i in sel])
    dev = mean.device
    return colour_matrices(codes[sel].to(dev), factors[sel].to(dev), mean)


def colour_map(x: torch.Tensor, mb: torch.Tensor, o: float) -> torch.Tensor:
    """Step 2 of one clip: (T, S, S, 3) uint8 or float -> float32 ``clamp(M @ rgb + b + o, o, 255 + o)``.

    One float32 multiply-add per output value either way: OpenCV's ``cv2.transform`` on the CPU (~4x torch's
    1 x 1 convolution there), a channels-last 1 x 1 convolution on CUDA.
    """
    if x.device.type == "cpu":
        m = mb.numpy().astype(np.float32)
        m[:, 3] += o
        flat = torch.empty(x.numel() + 3 * _TAIL)  # OpenCV's scalar tail rounds differently: keep it in padding
        flat[: x.numel()].view(x.shape).copy_(x)
        y = torch.from_numpy(_cv2().transform(flat.numpy().reshape(-1, 1, 3), m))[: x.numel() // 3].view(x.shape)
    else:
        y = F.conv2d(x.permute(0, 3, 1, 2).float(), mb[:, :3, None, None], mb[:, 3] + o).permute(0, 2, 3, 1)
    return y.clamp_(o, 255 + o)


def _finish(x: torch.Tensor, mb: torch.Tensor | None, lam: float, o: float, noise, dst: torch.Tensor) -> None:
    """Steps 2 and 3 of one clip into ``dst`` (uint8: ``o`` = 0.5 folded in, the cast truncates; float: ``o`` = 0).

    ``noise(x, offset)`` -> the op's ``D`` for this clip; ``offset``: what ``x`` carries (``o`` after a colour map).
    """
    offset = 0.0
    if mb is not None:  # step 2: clamp(M @ rgb + b), with the rounding offset already added
        x, offset = colour_map(x, mb, o), o
    if lam > 0:  # step 3: (1 - lam) V + lam D, the same D on every frame (the op makes D)
        d = noise(x, offset)
        e = d.contiguous() * lam + (o - offset * (1 - lam))  # float32 (D uint8 on the CPU, or a channel-planar view)
        if x.dtype == torch.uint8:
            x = torch.add(e, x, alpha=1 - lam)  # uint8 + float -> float32
        else:
            x = torch.add(e, x, alpha=1 - lam, out=x)  # in place: x is this clip's own buffer
        offset = o
    if x.dtype != torch.uint8 and offset != o:
        x = x + o
    if dst.dtype == torch.uint8 and x.dtype != torch.uint8 and dst.device.type == "cpu":
        np.copyto(dst.numpy(), x.numpy(), casting="unsafe")  # truncating value + 0.5 rounds half up; ~7x torch's cast
    else:
        dst.copy_(x)


def apply_views(batch: dict, size: int, quantize: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """A batch's views from its frames and parameters -> (B, V, T, size, size, 3), on ``batch["raw"]``'s device.

    ``batch``: ``raw`` uint8 (B, U, H, W, 3) distinct frames per video (padded; the padding is never read),
    ``frame_index`` (B, V, T), ``box`` (B, V, 4), ``flip`` (B, V), ``colour_ops`` / ``colour_factors`` (B, V, K),
    ``lam`` (B, V), ``pool`` uint8 (P, c, c, 3) windows, ``appearance_op`` and that op's own parameters
    (``ops.AppearanceOp.params``, e.g. RAD's ``cells`` (B, V, k*k) indices into ``pool``, BE's ``noise_frame``
    (B, V)); the parameters stay on the host (which clips need which step is decided there, without a device sync).
    Float32 in 0..255, or uint8 rounded half up with ``quantize`` (the +0.5 is folded into the last step);
    written into ``out`` (B*V, T, size, size, 3) when given (the workers pass shared memory: no copy to send).
    """
    b, v, t = batch["frame_index"].shape
    n, dev = b * v, batch["raw"].device
    batch = {**batch, "pool": batch["pool"].to(dev), "frame_index": batch["frame_index"].to(dev)}
    clips = _crops(batch, size)
    codes, factors = batch["colour_ops"].reshape(n, -1), batch["colour_factors"].reshape(n, -1)
    lam = batch["lam"].reshape(n).tolist()
    coloured = [i for i in range(n) if bool(codes[i].any())]
    maps = dict(zip(coloured, _colour_maps(clips, codes, factors, coloured))) if coloured else {}
    op, cache = APPEARANCE_OPS[batch["appearance_op"]], {}
    if out is None:
        out = torch.empty((n, t, size, size, 3), dtype=torch.uint8 if quantize else torch.float32, device=dev)
    for i in range(n):
        noise = functools.partial(op.noise, batch, i, cache=cache) if lam[i] > 0 else None
        _finish(clips[i], maps.get(i), lam[i], 0.5 if quantize else 0.0, noise, out[i])
    return out.view(b, v, t, size, size, 3)


def normalize(x: torch.Tensor, device: torch.device | str, mean: Sequence[float] = MEAN,
              std: Sequence[float] = STD) -> torch.Tensor:
    """uint8 or float clips (..., 3, T, H, W) in 0..255 -> float32 on ``device``: ``(x / 255 - mean) / std``.

    uint8 is moved first (4x fewer bytes over PCIe), then converted on the device; the result is
    contiguous even when ``x`` is a channels-last view (as the loader's batches are). ``mean`` / ``std``: moquad's
    (Kinetics) unless an encoder of another family states its own (``moquad.eval.encoders.Norm``).
    """
    if x.dim() < 4 or x.shape[-4] != 3:
        raise ValueError(f"expected clips shaped (..., 3, T, H, W), got {tuple(x.shape)}")
    x = x.to(device, non_blocking=True).float()
    shape = (3, 1, 1, 1)
    mean = torch.tensor(mean, device=x.device).view(shape) * 255
    std = torch.tensor(std, device=x.device).view(shape) * 255
    return ((x - mean) / std).contiguous()


def decode_batch(batch: dict, device: torch.device | str) -> torch.Tensor:
    """``decode_on_device`` batches: the frames' JPEG bytes -> ``raw`` uint8 (B, U, H, W, 3) on ``device``.

    One batched ``torchvision.io.decode_jpeg`` call (nvJPEG on CUDA); each video's frames are then placed in
    the zero-padded batch tensor with one copy per video. An undecodable frame raises
    :class:`~moquad.data.store.BadSample` naming it, with ``.position``: the batch row of its video (so the
    caller can replace that sample); the images are then decoded one by one to find it (rare).
    """
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    from moquad.data.store import BadSample

    flat, offsets = batch["jpeg"], batch["jpeg_offsets"].tolist()
    counts, hw = batch["jpeg_count"].tolist(), batch["hw"]
    pieces = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    with warnings.catch_warnings():  # torchvision >= 0.29 points to TorchCodec; decode_jpeg still works
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            images = decode_jpeg(pieces, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            for k, piece in enumerate(pieces):
                try:
                    decode_jpeg(piece, mode=ImageReadMode.RGB, device=device)
                except RuntimeError as err:
                    b = int(np.searchsorted(np.cumsum(counts), k, side="right"))
                    vid = batch["video_id"][b] if "video_id" in batch else f"in batch row {b}"
                    bad = BadSample(f"frame {k - sum(counts[:b])} of video {vid} is not a decodable "
                                    f"JPEG ({' '.join(str(err).split())[-120:]})")
                    bad.position = b  # type: ignore[attr-defined]
                    raise bad from err
            raise
    h, w = (int(x) for x in hw.max(0).values)
    raw = torch.zeros((len(counts), max(counts), h, w, 3), dtype=torch.uint8, device=images[0].device)
    start = 0
    for b, n in enumerate(counts):
        frames = torch.stack(images[start : start + n])  # (n, 3, h_b, w_b)
        raw[b, :n, : frames.shape[2], : frames.shape[3]] = frames.permute(0, 2, 3, 1)
        start += n
    return raw


def to_model(batch: dict, device: torch.device | str, size: int) -> torch.Tensor:
    """A loader batch -> normalised float views (B, V, 3, T, size, size) on ``device``.

    Batches augmented in the workers carry uint8 ``views``; ``augment_on_device`` batches carry the
    frames (or, with ``decode_on_device``, their JPEG bytes) and the view parameters, turned into views here,
    on ``device``.
    """
    if "views" in batch:
        return normalize(batch["views"], device)
    if "raw" not in batch:
        batch = {**batch, "raw": decode_batch(batch, device)}
    keys = (*PARAM_KEYS, *APPEARANCE_OPS[batch["appearance_op"]].params)
    moved = {**{k: batch[k] for k in keys}, "raw": batch["raw"].to(device, non_blocking=True)}
    views = apply_views(moved, size)  # moves the few small tensors it needs on the device itself  # (B, V, T, S, S, 3) float on the device
    return normalize(views.permute(0, 1, 5, 2, 3, 4), device)
