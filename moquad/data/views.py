"""Draw everything random about one video's views ONCE: :class:`ViewParams` (then ``augment.apply_views``).

Which views a video gets is a :class:`ViewPlan`: plain data (a tuple of :class:`View`, each with its ROLE for the
loss: ``anchor``, ``positive``, ``intra_negative``; the speed it is played at; the motion op and whether the
appearance op disturbs it). A pre-training method (:data:`moquad.train.methods.METHODS`) names the plan of each of
its stages; the loader builds the views a plan names and hands the plan's roles (``batch["roles"]``) to the loss.
The plans of the shipped methods, made here from the loader settings (this module never imports ``train/``):

  - :func:`quadruple`: ``anchor`` (dilation n), the positive ``ad_pos`` (another clip at n, then the appearance
    disturbance; a plain ``pos`` when ``ad_pos=False``), then per motion op of ``motion_ops``
    (:data:`moquad.data.ops.MOTION_OPS`) an ``intra_neg`` (motion disturbed: dilation m for ``speed``) and an
    ``ad_intra_neg`` (another motion-disturbed clip, then the appearance disturbance); the second op's are
    ``intra_neg:OP`` / ``ad_intra_neg:OP``. ``intra_neg`` / ``ad_intra_neg`` can be switched off (paper Table 4);
    with all three switches off this is the SimCLR base of the ladder (anchor + plain positive).
  - :func:`speed_pair` (the appearance warm-up task, Eq. 3): ``clip_n, clip_m``: clips at dilations ``n != m``.
  - :func:`fixed_pair` (classic SimCLR): ``clip1, clip2``: two random clips at ``simclr_dilation``.
A view's ``name`` is a label for people and tests; nothing parses it.
Every clip has its own random start and its own spatial augmentation (crop box, colour ops); flips follow
``LoaderConfig.flip`` (:data:`moquad.data.ops.FLIP_POLICIES`: per view, one per video, or none).
Speeds and short videos follow :mod:`moquad.data.clip_frames`.

The parameters are the whole randomness: frame indices, crop boxes, flips, colour operations, lambda
and the appearance op's own parameters (its row's ``params``, e.g. the RAD windows, BE's frame).
:func:`moquad.data.augment.apply_views` turns them into pixels, per batch in the DataLoader workers or batched
on the accelerator (``augment_on_device``): the two paths run the same function on the same parameters.
:func:`reduce_views` picks the frames the loader may decode at reduced size (``scaled_decode``) and gives the
boxes in those frames' pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moquad.config import LoaderConfig
from moquad.data.clip_frames import draw_speeds, random_clip
from moquad.data.ops import APPEARANCE_OPS, FLIP_POLICIES, MOTION_OPS
from moquad.data.store import REDUCTIONS, largest_reduction, reduced_hw

COLOUR_OPS = ("none", "brightness", "contrast", "saturation", "hue", "gray")  # codes of ``colour_ops``
MAX_COLOUR_OPS = 5  # jitter (4 ops in random order) + grayscale

ROLES = ("anchor", "positive", "intra_negative")  # what a view is to the loss (a method's loss reads roles)
SPEEDS = ("n", "m", "fixed")  # the anchor's dilation n, the other drawn dilation m, loader.simclr_dilation


@dataclass(frozen=True)
class View:
    """One view of a plan: its role for the loss (``anchor``, ``positive`` or ``intra_negative``), its name, the
    speed it is played at (``n`` or ``m``: two different dilations drawn per video from ``loader.dilations``;
    ``fixed``: ``loader.simclr_dilation``), the motion op that makes its frames (a row of ``moquad.MOTION_OPS``,
    which picks n or m itself; None: a plain clip) and whether the appearance op (``loader.appearance_op``)
    disturbs it."""

    role: str
    name: str
    speed: str = "n"
    motion: str | None = None
    disturbed: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES or self.speed not in SPEEDS:
            raise ValueError(f"view {self.name!r}: role must be one of {ROLES} and speed one of {SPEEDS}, got "
                             f"{self.role!r}, {self.speed!r}")
        if self.motion is not None and self.motion not in MOTION_OPS:
            raise ValueError(f"view {self.name!r}: unknown motion op {self.motion!r}; one of {', '.join(MOTION_OPS)}")


@dataclass(frozen=True)
class ViewPlan:
    """The views of every video of a batch, in order (plain data: it travels to the loader workers)."""

    views: tuple[View, ...]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(v.role for v in self.views)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.views)

    @property
    def draws_speeds(self) -> bool:
        """True when a view plays at a drawn speed (then n, m are drawn per video, before the clips)."""
        return any(v.speed != "fixed" or v.motion is not None for v in self.views)

    def needs_two_speeds(self) -> bool:
        """True when a view plays at m != n (a clip at ``m``, or a motion op that changes the speed)."""
        return any(v.speed == "m" or (v.motion is not None and MOTION_OPS[v.motion].second_speed) for v in self.views)


def quadruple(cfg: LoaderConfig) -> ViewPlan:
    """MoQuad's quadruple under the ablation switches and motion ops of ``cfg``: the ``anchor`` (a clip at
    dilation n), the positive (another clip at n, disturbed by the appearance op: the AD-Pos; a plain clip with
    ``ad_pos=False``) and, per motion op, an Intra-Neg (the op's clip, e.g. dilation m for ``speed``) and an
    AD-Intra-Neg (the same clip, disturbed), each dropped when its switch is off."""
    views = [View("anchor", "anchor"), View("positive", "ad_pos" if cfg.ad_pos else "pos", disturbed=cfg.ad_pos)]
    for i, op in enumerate(cfg.motion_ops):
        plain, disturbed = ("intra_neg", "ad_intra_neg") if i == 0 else (f"intra_neg:{op}", f"ad_intra_neg:{op}")
        if cfg.intra_neg:
            views.append(View("intra_negative", plain, motion=op))
        if cfg.ad_intra_neg:
            views.append(View("intra_negative", disturbed, motion=op, disturbed=True))
    return ViewPlan(tuple(views))


def speed_pair(cfg: LoaderConfig) -> ViewPlan:
    """The appearance warm-up task's views (Eq. 3): a clip at n (anchor) and one at m (positive)."""
    return ViewPlan((View("anchor", "clip_n"), View("positive", "clip_m", speed="m")))


def fixed_pair(cfg: LoaderConfig) -> ViewPlan:
    """Classic SimCLR's views: two clips at ``loader.simclr_dilation``."""
    return ViewPlan((View("anchor", "clip1", speed="fixed"), View("positive", "clip2", speed="fixed")))

# pick(count, rng) -> (donor pool indices, donor video ids) for RAD-inter, bound to one sample
DonorPick = Callable[[int, np.random.Generator], tuple[np.ndarray, list[str]]]


@dataclass
class ViewParams:
    """All random choices of one video's V views (clips of T frames)."""

    names: tuple[str, ...]
    frames: np.ndarray  # (U,) sorted distinct source frames the views use (decoded once)
    frame_index: np.ndarray  # (V, T) positions into ``frames``
    box: np.ndarray  # (V, 4) crop top, left, height, width in source pixels
    flip: np.ndarray  # (V,) bool
    colour_ops: np.ndarray  # (V, MAX_COLOUR_OPS) codes into COLOUR_OPS, applied in order
    colour_factors: np.ndarray  # (V, MAX_COLOUR_OPS) float32
    lam: np.ndarray  # (V,) float32, 0 = no appearance disturbance
    appearance_op: str  # the row of ops.APPEARANCE_OPS that drew ``op_params``
    op_params: dict[str, np.ndarray]  # that op's own parameters (its ``params``) by name, each (V, *shape)
    info: dict[str, Any] = field(default_factory=dict)  # dilations, rule, frame indices, donor ids


def reduced_box(box: np.ndarray, reduce: int, hw: tuple[int, int]) -> np.ndarray:
    """A crop box (top, left, h, w) of a ``hw`` frame in the pixels of that frame decoded at ``1 / reduce``: each
    edge at the nearest reduced pixel edge (off by at most ``reduce / 2`` source pixels), inside the frame."""
    return _reduced_boxes(np.asarray(box, dtype=np.int64)[None], np.array([reduce]), hw)[0]


def _reduced_boxes(box: np.ndarray, reduce: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """:func:`reduced_box` of boxes (N, 4), each at its own reduction (N,)."""
    rh, rw = reduced_hw(hw, reduce)  # per box
    t0, l0 = (2 * box[:, 0] + reduce) // (2 * reduce), (2 * box[:, 1] + reduce) // (2 * reduce)
    t1 = np.minimum(rh, (2 * (box[:, 0] + box[:, 2]) + reduce) // (2 * reduce))
    l1 = np.minimum(rw, (2 * (box[:, 1] + box[:, 3]) + reduce) // (2 * reduce))
    return np.stack([t0, l0, t1 - t0, l1 - l0], axis=1).astype(np.int64)


def own_windows(p: ViewParams) -> np.ndarray:
    """The positions into ``p.frames`` that its op's pool windows read from the video itself (an op whose
    ``source`` is ``own``, e.g. RAD-intra), flat, in (view, window) order; empty for other ops."""
    op = APPEARANCE_OPS[p.appearance_op]
    if op.source != "own" or not op.pool_params:
        return np.zeros(0, np.int64)
    flat = np.concatenate([p.op_params[k].reshape(-1) for k in op.pool_params])
    return flat[flat >= 0]


def reduce_views(p: ViewParams, hw: tuple[int, int], size: int, cell: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Reduced-size decoding of one video: (reduction of each decoded frame (U,), boxes in those frames (V, 4)).

    A view gets the largest reduction (``store.REDUCTIONS``: 8, 4, 2, 1) whose box still covers ``size`` x
    ``size`` (its resize still shrinks or copies); views that share a frame share the smallest of theirs (a
    view's frames all have one scale, so one box); a frame an ``own`` op's window uses (:func:`own_windows`) keeps
    ``cell`` pixels."""
    if min(reduced_hw(hw, REDUCTIONS[-2])) < size:  # no box covers the output at 1/2: every frame full size
        return np.ones(len(p.frames), np.int64), p.box.astype(np.int64)
    per_view = np.ones(len(p.box), np.int64)
    for r in REDUCTIONS[-2::-1]:  # 2, 4, 8: the largest reduction that still covers wins
        covers = (_reduced_boxes(p.box, np.full(len(p.box), r), hw)[:, 2:] >= size).all(axis=1)
        per_view[covers] = r
    cap = largest_reduction(hw, cell)
    frame_cap = np.full(len(p.frames), REDUCTIONS[0], dtype=np.int64)
    frame_cap[own_windows(p)] = cap
    while True:  # views sharing frames (directly or through other views) end with one reduction
        per_frame = frame_cap.copy()
        np.minimum.at(per_frame, p.frame_index.ravel(), np.repeat(per_view, p.frame_index.shape[1]))
        settled = per_frame[p.frame_index].min(axis=1)
        if (settled == per_view).all():
            break
        per_view = settled
    return per_frame, _reduced_boxes(p.box, per_view, hw)


def check_config(cfg: LoaderConfig, plan: ViewPlan | None = None) -> None:
    """Validate the loader settings that combine several fields or name rows of the ops tables (each field alone is
    checked by moquad.config; a command checks the table choices when it resolves its config, a library caller here)
    for the views of ``plan`` (default: :func:`quadruple`)."""
    if plan is not None and not isinstance(plan, ViewPlan):
        raise ValueError(f"views must be a moquad.data.views.ViewPlan, got {type(plan).__name__}")
    for name, table, chosen in (("appearance_op", APPEARANCE_OPS, (cfg.appearance_op,)),
                                ("motion_ops", MOTION_OPS, tuple(cfg.motion_ops)), ("flip", FLIP_POLICIES, (cfg.flip,))):
        unknown = [c for c in chosen if c not in table]
        if unknown:
            raise ValueError(f"unknown loader.{name} {unknown[0]!r}; one of {', '.join(table)}")
    if (plan or quadruple(cfg)).needs_two_speeds():
        if len(set(cfg.dilations)) < 2:
            raise ValueError(f"dilations needs two different values for n != m, got {tuple(cfg.dilations)}")
    if not 1 <= cfg.rad_k <= cfg.size:
        raise ValueError(f"rad_k must be between 1 and the crop size {cfg.size}, got {cfg.rad_k}")


def cell_size(cfg: LoaderConfig) -> int:
    """Side of the square a RAD window (donor frame) is stored at: ``ceil(size / k)``."""
    return math.ceil(cfg.size / cfg.rad_k)


def needs_donors(cfg: LoaderConfig, plan: ViewPlan) -> bool:
    """True when views use frames of other videos (an appearance op whose source is ``donors``)."""
    return APPEARANCE_OPS[cfg.appearance_op].source == "donors" and any(v.disturbed for v in plan.views)


def plan_clips(num_frames: int, cfg: LoaderConfig, rng: np.random.Generator,
               plan: ViewPlan) -> tuple[list, dict[str, Any]]:
    """[(name, frame indices (T,), appearance-disturbed?)] of one video's views, and info (dilations, rule).

    The draws, in this order: n, m (when a view plays at a drawn speed), then each view's frames."""
    t = cfg.frames
    if plan.draws_speeds:
        n, m, rule = draw_speeds(num_frames, t, cfg.dilations, rng)
        info = {"dilations": (n, m), "rule": rule}
    else:
        n = m = cfg.simclr_dilation
        info = {"dilations": (n, m), "rule": "pair"}
    out = []
    for v in plan.views:
        if v.motion is None:
            idx = random_clip(num_frames, t, {"n": n, "m": m, "fixed": cfg.simclr_dilation}[v.speed], rng)
        else:
            op = MOTION_OPS[v.motion]
            if op.second_speed and info["rule"] != "speed":  # a short video: its reverse (clip_frames.py)
                op, d = MOTION_OPS["reverse"], n
            else:
                d = m if op.second_speed else n
            idx = op.frames(num_frames, t, d, rng)
        out.append((v.name, idx, v.disturbed))
    return out, info


def random_crop_box(height: int, width: int, scale: tuple[float, float], rng: np.random.Generator) -> tuple[int, ...]:
    """(top, left, h, w) of a random resized crop (torchvision's RandomResizedCrop rule)."""
    area = height * width
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    side = min(height, width)  # fallback: central square
    return (height - side) // 2, (width - side) // 2, side, side


def draw_colour(cfg: LoaderConfig, rng: np.random.Generator) -> tuple[list[int], list[float]]:
    """SimCLR colour jitter (p=color_jitter, 4 ops in random order) + grayscale (p=grayscale) as codes."""
    ops: list[tuple[int, float]] = []
    if cfg.color_jitter > 0 and rng.random() < cfg.color_jitter:
        s, lo = cfg.color_strength, max(0.0, 1 - 0.8 * cfg.color_strength)
        jitter = [(1, rng.uniform(lo, 1 + 0.8 * s)), (2, rng.uniform(lo, 1 + 0.8 * s)),
                  (3, rng.uniform(lo, 1 + 0.8 * s)), (4, rng.uniform(-0.2 * s, 0.2 * s))]
        ops = [jitter[i] for i in rng.permutation(4)]
    if cfg.grayscale > 0 and rng.random() < cfg.grayscale:
        ops.append((5, 0.0))
    codes, factors = [0] * MAX_COLOUR_OPS, [0.0] * MAX_COLOUR_OPS
    for i, (code, v) in enumerate(ops):
        codes[i], factors[i] = code, float(v)
    return codes, factors


def draw_views(num_frames: int, hw: tuple[int, int], cfg: LoaderConfig, rng: np.random.Generator,
               pick: DonorPick | None = None, video_id: str = "", views: ViewPlan | None = None) -> ViewParams:
    """All random parameters of one video's ``views`` (default :func:`quadruple`; frames of ``hw`` = (height,
    width) pixels)."""
    plan, info = plan_clips(num_frames, cfg, rng, views or quadruple(cfg))
    frames, inverse = np.unique(np.concatenate([idx for _, idx, _ in plan]), return_inverse=True)
    nv, t, kk = len(plan), cfg.frames, cfg.rad_k ** 2
    op = APPEARANCE_OPS[cfg.appearance_op]
    ctx = {"rad_lambda": cfg.rad_lambda, "kk": kk, "frames": t, "num_decoded": len(frames), "video_id": video_id,
           "pick": pick}
    p = ViewParams(
        names=tuple(name for name, _, _ in plan), frames=frames, frame_index=inverse.reshape(nv, t),
        box=np.zeros((nv, 4), np.int64), flip=FLIP_POLICIES[cfg.flip](nv, rng),
        colour_ops=np.zeros((nv, MAX_COLOUR_OPS), np.int64), colour_factors=np.zeros((nv, MAX_COLOUR_OPS), np.float32),
        lam=np.zeros(nv, np.float32), appearance_op=cfg.appearance_op,
        op_params={k: np.full((nv, *(ctx[d] if isinstance(d, str) else d for d in spec.shape)), spec.fill, spec.dtype)
                   for k, spec in op.params.items()},
        info={**info, "indices": [idx for _, idx, _ in plan], "donor_ids": []},
    )
    if op.source == "donors" and pick is None and any(d for _, _, d in plan):
        raise ValueError(f"appearance_op={cfg.appearance_op} needs donor frames; pass a donor pool")
    for v, (_name, _idx, disturbed) in enumerate(plan):
        p.box[v] = random_crop_box(hw[0], hw[1], tuple(cfg.crop_scale), rng)
        p.colour_ops[v], p.colour_factors[v] = draw_colour(cfg, rng)
        drawn = op.draw(ctx, rng) if disturbed else None
        if drawn is not None:
            p.lam[v] = drawn.lam
            for k, value in drawn.params.items():
                if k not in p.op_params:
                    raise KeyError(f"appearance op {cfg.appearance_op!r} drew {k!r}, which its params do not declare")
                p.op_params[k][v] = value
        p.info["donor_ids"].append(list(drawn.donor_ids) if drawn is not None else [])
    return p
