"""Build the views of one video (simclr pair, appearance pair or MoQuad quadruple) from its JPEG frames.

Modes (``LoaderConfig.mode``), views in this order:
  - ``simclr``: ``clip1, clip2``: two random clips at ``simclr_dilation``, independent augmentation.
  - ``appearance`` (warm-up task, Eq. 3): ``clip_n, clip_m``: clips at dilations ``n != m``.
  - ``moquad``: ``anchor`` (dilation n), ``ad_pos`` (another clip at n, then the appearance
    disturbance; named ``pos`` and left plain when ``ad_pos=False``), ``intra_neg`` (motion
    disturbed: dilation m for ``speed``), ``ad_intra_neg`` (another motion-disturbed clip, then the
    appearance disturbance). ``intra_neg`` / ``ad_intra_neg`` can be switched off (paper Table 4).
Every clip has its own random start and its own spatial augmentation. The frames of all views are
decoded once (a frame shared by two clips is decoded once).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from moquad.config import LoaderConfig
from moquad.data.augment import apply_colour, colour_map, crop_resize, round_into, sample_aug
from moquad.data.disturb import (
    be_noise,
    blend,
    cell_size,
    check_ops,
    draw_lambda,
    motion_indices,
    rad_noise,
    resize_donors,
)
from moquad.data.donors import DonorPool
from moquad.data.frames import decode_frames
from moquad.data.sampling import draw_dilations, random_clip

MODES = ("simclr", "appearance", "moquad")


def check_config(cfg: LoaderConfig) -> None:
    """Validate the loader settings with messages that say what to change."""
    if cfg.mode not in MODES:
        raise ValueError(f"unknown loader mode {cfg.mode!r}; choose one of {', '.join(MODES)}")
    check_ops(cfg.appearance_op, cfg.motion_op)
    if cfg.frames < 1 or cfg.size < 1:
        raise ValueError(f"frames and size must be >= 1, got frames={cfg.frames}, size={cfg.size}")
    if cfg.mode == "appearance" or (cfg.mode == "moquad" and cfg.motion_op == "speed"):
        if len(set(cfg.dilations)) < 2:
            raise ValueError(f"dilations needs two different values for n != m, got {tuple(cfg.dilations)}")
    cell_size(cfg.size, cfg.rad_k)


def view_names(cfg: LoaderConfig) -> tuple[str, ...]:
    """Names of the views ``make_views`` returns for ``cfg``, in order."""
    if cfg.mode == "simclr":
        return ("clip1", "clip2")
    if cfg.mode == "appearance":
        return ("clip_n", "clip_m")
    names = ["anchor", "ad_pos" if cfg.ad_pos else "pos"]
    if cfg.intra_neg:
        names.append("intra_neg")
    if cfg.ad_intra_neg:
        names.append("ad_intra_neg")
    return tuple(names)


def needs_donor_pool(cfg: LoaderConfig) -> bool:
    """True when views use RAD-inter (and so a cross-shard donor pool)."""
    return cfg.mode == "moquad" and cfg.appearance_op == "rad_inter" and (cfg.ad_pos or cfg.ad_intra_neg)


def plan_views(num_frames: int, cfg: LoaderConfig, rng: np.random.Generator) -> tuple[list, tuple[int, int]]:
    """[(name, frame indices, appearance-disturbed?)] for one video, and the dilations (n, m) used."""
    t = cfg.frames
    if cfg.mode == "simclr":
        d = cfg.simclr_dilation
        return [("clip1", random_clip(num_frames, t, d, rng), False),
                ("clip2", random_clip(num_frames, t, d, rng), False)], (d, d)
    if cfg.motion_op == "speed" or cfg.mode == "appearance":
        n, m = draw_dilations(cfg.dilations, rng)
    else:  # reverse / shuffle keep the anchor's speed
        n = m = int(rng.choice(np.asarray(cfg.dilations)))
    if cfg.mode == "appearance":
        return [("clip_n", random_clip(num_frames, t, n, rng), False),
                ("clip_m", random_clip(num_frames, t, m, rng), False)], (n, m)

    def negative() -> np.ndarray:
        return motion_indices(random_clip(num_frames, t, m, rng), cfg.motion_op, rng)

    plan = [("anchor", random_clip(num_frames, t, n, rng), False),
            ("ad_pos" if cfg.ad_pos else "pos", random_clip(num_frames, t, n, rng), cfg.ad_pos)]
    if cfg.intra_neg:
        plan.append(("intra_neg", negative(), False))
    if cfg.ad_intra_neg:
        plan.append(("ad_intra_neg", negative(), True))
    return plan, (n, m)


def make_views(
    meta: dict[str, Any],
    jpgs: bytes,
    cfg: LoaderConfig,
    rng: np.random.Generator,
    donors: DonorPool | None = None,
    keep_clean: bool = False,
    colour_on_device: bool = False,
) -> dict[str, Any]:
    """Views of one video: ``views`` uint8 (V, 3, T, size, size), ``names``, ``lam`` float32 (V,),
    and ``info`` (dilations, frame indices and donor video ids per view; with ``keep_clean``, the
    float clips before the appearance disturbance, for tests). With ``colour_on_device`` the colour
    jitter is not applied but returned as ``colour`` float32 (V, 3, 4) (see ``augment.normalize``).
    """
    offsets = meta["frame_offsets"]
    plan, dilations = plan_views(len(offsets) - 1, cfg, rng)
    unique = np.unique(np.concatenate([idx for _, idx, _ in plan]))
    decoded = decode_frames(jpgs, offsets, unique)
    out = render_views(plan, unique, decoded, str(meta["video_id"]), cfg, rng, donors, keep_clean, colour_on_device)
    out["info"]["dilations"] = dilations
    return out


def render_views(
    plan: list,
    unique: np.ndarray,
    decoded: np.ndarray,
    video_id: str,
    cfg: LoaderConfig,
    rng: np.random.Generator,
    donors: DonorPool | None = None,
    keep_clean: bool = False,
    colour_on_device: bool = False,
) -> dict[str, Any]:
    """Augment and disturb the planned clips given the decoded frames ``decoded[i]`` = frame ``unique[i]``.

    Order per clip: crop/resize/flip (uint8) -> colour map (float, only when drawn) -> appearance
    disturbance at the crop size -> one rounding to uint8, written straight into the output.
    ``colour_on_device`` leaves out the colour map and returns it as ``colour`` (V, 3, 4) instead:
    the device applies it after the appearance disturbance (an affine map of a blend is the blend
    of the mapped images, so RAD's motion-preserving property is kept, up to clamping).
    """
    height, width = decoded.shape[1:3]
    k, size = cfg.rad_k, cfg.size
    out = torch.empty((len(plan), len(plan[0][1]), size, size, 3), dtype=torch.uint8)  # channels last
    lams, donor_ids, clean = [], [], []
    colours = torch.zeros((len(plan), 3, 4), dtype=torch.float32)
    colours[:, :, :3] = torch.eye(3)
    for v, (_name, idx, disturbed) in enumerate(plan):
        aug = sample_aug(height, width, cfg, rng)
        clip = crop_resize(decoded, aug, size, index=np.searchsorted(unique, idx))
        cmap = colour_map(clip, aug)
        lam, ids = 0.0, []
        rad = disturbed and cfg.appearance_op != "none"
        if cmap is not None and colour_on_device:
            colours[v, :, :3], colours[v, :, 3] = cmap
            cmap = None
        folded = cmap is not None and not (rad or keep_clean)  # +0.5 rounding offset folded in
        if cmap is not None:
            clip = apply_colour(clip, *cmap, offset=0.5 if folded else 0.0)
        elif rad or keep_clean:
            clip = clip.float()
        if keep_clean:
            clean.append(clip.clone().permute(3, 0, 1, 2))
        if rad:
            lam = draw_lambda(rng, cfg.rad_lambda)
            if cfg.appearance_op == "be":
                noise = be_noise(clip, rng)
                ids = [video_id]
            elif cfg.appearance_op == "rad_intra":
                pick = rng.integers(0, len(unique), size=k * k)
                cells = resize_donors(torch.from_numpy(decoded[pick]), cell_size(size, k))
                noise, ids = rad_noise(cells, k, size), [video_id] * (k * k)
            else:
                if donors is None:
                    raise ValueError("appearance_op=rad_inter needs a donor pool")
                cells, ids = donors.draw(k * k, video_id, rng)
                noise = rad_noise(cells, k, size)
            clip = blend(clip, noise, lam, offset=0.5)  # blends of values in 0..255 stay in 0..255
            folded = True
        if clip.dtype == torch.uint8:
            out[v] = clip
        else:
            round_into(clip if folded else clip.add_(0.5), out[v])
        lams.append(lam)
        donor_ids.append(ids)
    info: dict[str, Any] = {"indices": [idx for _, idx, _ in plan], "donor_ids": donor_ids}
    if keep_clean:
        info["clean"] = clean
    result = {
        "views": out.permute(0, 4, 1, 2, 3),  # (V, 3, T, H, W) view of channels-last memory
        "names": tuple(name for name, _, _ in plan),
        "lam": np.asarray(lams, dtype=np.float32),
        "info": info,
    }
    if colour_on_device:
        result["colour"] = colours
    return result
