"""The motion report: does a frozen video encoder react to motion, or only to appearance?

Each video of a split gives ONE clip (``frames`` frames at ``dilation``, centred: the evaluation clip rule of
:mod:`moquad.data.clip_frames`) and controlled variants of it (:data:`TRANSFORMS`): the same frames under another
crop (the reference: an appearance-preserving change every encoder is trained to ignore), played backwards, at
2x and 4x speed, mirrored, and still (its middle frame repeated). Every encoder (any name of the encoder table,
:data:`moquad.eval.encoders.FAMILIES`: moquad checkpoints and exports, torchvision and Hugging Face video models)
sees the same frames, framed and normalised as its own family says (:class:`moquad.eval.encoders.Framing`,
:class:`moquad.eval.encoders.Norm`; the views: :mod:`moquad.eval.motion_views`). From
the pooled features:

- **arrow of time**: top-1 of a logistic regression (:func:`moquad.eval.linear.fit_logistic`) telling a clip from
  its reversal, trained on half of the videos and tested on the other half (chance 50 %); and the feature
  distance clip <-> reversed divided by clip <-> another crop (0: blind to the arrow; 1: as different as a crop);
- **speed**: the same for 1x / 2x / 4x (a 3-way classifier, chance 33 %; distance ratios of 2x and 4x);
- **mirror**: distance ratio of the horizontal flip;
- **appearance share**: cosine similarity of a clip and its still version (1: the feature is what one frame shows);
- **direction pairs** (labelled splits): for class pairs that differ only by direction (:data:`PAIRS` or the
  user's), the share of the pair's videos whose kNN vote (:func:`moquad.eval.retrieve.knn_classify`,
  leave-one-out among the pair's videos) goes to the partner class (0: told apart; 50 %: direction-blind).

Distances are cosine distances after subtracting the mean clip feature of the split (so a feature offset every
video shares does not count as similarity). Videos too short for the 4x clip use the stretched clip of the
clip rule (counted in the result as ``short_videos``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import Progress
from rich.table import Table

from moquad.config import MotionConfig
from moquad.data.clip_frames import clip_span
from moquad.data.store import Split, read_info
from moquad.errors import MoquadError
from moquad.eval.clips import PretrainClip, pretrain_clip
from moquad.eval.encoders import Encoder, config_clip, load_encoder
from moquad.eval.motion_views import SPEEDS, TRANSFORMS, VIEWS, MotionViews
from moquad.models.backbones import DEFAULT_INPUT

# ----------------------------------------------------------------------------- the direction pairs


# name -> class pairs that differ only by the direction (or the arrow) of their motion; a pair counts when the
# split's class list holds both names (case-insensitive)
PAIRS: dict[str, list[tuple[str, str]]] = {
    "ssv2": [
        ("Pushing something from left to right", "Pushing something from right to left"),
        ("Pulling something from left to right", "Pulling something from right to left"),
        ("Moving something up", "Moving something down"),
        ("Moving something towards the camera", "Moving something away from the camera"),
        ("Moving something and something closer to each other", "Moving something and something away from each other"),
        ("Approaching something with your camera", "Moving away from something with your camera"),
        ("Turning the camera left while filming something", "Turning the camera right while filming something"),
        ("Turning the camera upwards while filming something", "Turning the camera downwards while filming something"),
        ("Opening something", "Closing something"),
        ("Folding something", "Unfolding something"),
        ("Covering something with something", "Uncovering something"),
        ("Putting something into something", "Taking something out of something"),
    ],
    "synth-directions": [("Up", "Down"), ("ZoomIn", "ZoomOut"), ("Left", "Right"), ("Clockwise", "CounterClockwise")],
}


def parse_pair(text: str) -> tuple[str, str]:
    """``"A|B"`` -> (A, B)."""
    parts = [p.strip() for p in text.split("|")]
    if len(parts) != 2 or not all(parts):
        raise MoquadError(f"--pair {text!r}: give two class names separated by '|', e.g. "
                          "'Moving something up|Moving something down'")
    return parts[0], parts[1]


def resolve_pairs(classes: Sequence[str], user: Sequence[tuple[str, str]]) -> list[tuple[int, int]]:
    """Label pairs to measure: the user's (each class must exist) plus every built-in pair the split holds."""
    where = {c.lower(): k for k, c in enumerate(classes)}
    out: list[tuple[int, int]] = []
    for a, b in user:
        missing = [c for c in (a, b) if c.lower() not in where]
        if missing:
            raise MoquadError(f"--pair: class {missing[0]!r} is not in this dataset's classes "
                              f"({', '.join(list(classes)[:8])}{', ...' if len(classes) > 8 else ''})")
        out.append((where[a.lower()], where[b.lower()]))
    for pairs in PAIRS.values():
        out += [(where[a.lower()], where[b.lower()]) for a, b in pairs if a.lower() in where and b.lower() in where]
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- features and measures


@torch.inference_mode()
def transform_features(encoders: Sequence[Encoder], split: Split, rows: Sequence[int], frames: int, dilation: int,
                       size: int, batch_size: int = 16, workers: int = 0, device: str | torch.device = "cpu",
                       show: bool = True) -> dict[str, np.ndarray]:
    """{label: float32 (videos, views, D)}: every encoder's pooled feature of every view of every video; each
    network's weights and BN statistics are checked unchanged afterwards (as extraction does)."""
    from moquad.eval.common import check_unchanged, snapshot

    nets = {e.label: e.to(device).eval() for e in encoders}
    before = {label: snapshot(net) for label, net in nets.items()}
    framings = list(dict.fromkeys(e.framing for e in encoders))  # one set of views per framing the encoders use
    loader = torch.utils.data.DataLoader(MotionViews(split, rows, frames, dilation, size, framings),
                                         batch_size=None, num_workers=workers)
    out: dict[str, list[np.ndarray]] = {label: [] for label in nets}
    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task(f"motion report: {len(nets)} encoder(s) x {len(VIEWS)} views", total=len(rows))
        for _, framed in loader:
            inputs: dict[Any, torch.Tensor] = {}  # one normalised copy per framing and normalisation
            for label, net in nets.items():
                key = (net.framing, net.norm)
                if key not in inputs:
                    inputs[key] = net.normalize(framed[framings.index(net.framing)], device)
                x = inputs[key]
                f = [net(x[s : s + batch_size]).float() for s in range(0, len(x), batch_size)]
                out[label].append(torch.cat(f).cpu().numpy())
            progress.advance(task)
    for label, net in nets.items():
        check_unchanged(net, before[label], f"encoder {label}")
    return {label: np.stack(v) for label, v in out.items()}


def centred_unit(f: np.ndarray) -> np.ndarray:
    """(videos, views, D) minus the mean clip feature of the split, then L2-normalised (zero stays zero)."""
    z = f.astype(np.float64) - f[:, VIEWS.index("clip")].astype(np.float64).mean(0)
    return z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)


def held_out_accuracy(groups: Sequence[np.ndarray], seed: int, l2: float = 1e-4) -> float | None:
    """Top-1 of a logistic regression telling ``groups`` apart (group k: (videos, D) features of class k), fitted on a
    seeded half of the videos and tested on the other half (the same videos for every class: nothing of a test
    video is seen in training). Features standardised with the training mean / std."""
    from moquad.eval.linear import fit_logistic

    n = len(groups[0])
    perm = np.random.default_rng(seed).permutation(n)
    train, test = perm[: max(1, n // 2)], perm[max(1, n // 2):]
    if len(test) == 0:
        return None
    k = len(groups)
    xtr = np.concatenate([g[train] for g in groups]).astype(np.float64)
    mean, std = xtr.mean(0), xtr.std(0) + 1e-6
    clf = fit_logistic((xtr - mean) / std, np.repeat(np.arange(k), len(train)), k, l2)
    xte = np.concatenate([g[test] for g in groups]).astype(np.float64)
    with torch.no_grad():
        pred = clf(torch.as_tensor((xte - mean) / std)).argmax(1).numpy()
    return float((pred == np.repeat(np.arange(k), len(test))).mean())


def distances(f: np.ndarray) -> dict[str, Any]:
    """Mean centred cosine distance clip <-> each view, the same divided by clip <-> another crop (``ratio``), the
    distance between different videos' clips (scale), and the appearance share (cosine clip <-> still)."""
    z = centred_unit(f)
    c = VIEWS.index("clip")
    dist = {name: float((1 - (z[:, c] * z[:, j]).sum(-1)).mean()) for j, name in enumerate(VIEWS) if name != "clip"}
    sim, n = z[:, c] @ z[:, c].T, len(z)
    other = float(1 - (sim.sum() - np.trace(sim)) / (n * (n - 1))) if n > 1 else None
    ref = dist["crop"]
    ratio = {name: (d / ref if ref > 1e-12 else None) for name, d in dist.items() if name != "crop"}
    return {"distance": dist, "ratio_to_crop": ratio, "distance_other_video": other,
            "appearance_share": 1.0 - dist["still"]}


def pair_confusion(clip_feats: np.ndarray, labels: np.ndarray, pairs: Sequence[tuple[int, int]], classes: Sequence[str],
                   k: int = 10, t: float = 0.07) -> dict[str, Any]:
    """Per direction pair (a, b): the share of its videos whose weighted kNN vote (DINO's, leave-one-out among the
    pair's videos, centred cosine) goes to the partner class; and the mean over pairs. 0.5 = direction-blind."""
    from moquad.eval.retrieve import knn_classify
    from moquad.eval.search import nearest, prepare

    per: dict[str, float] = {}
    for a, b in pairs:
        rows = np.flatnonzero((labels == a) | (labels == b))
        if len(rows) < 3 or not ((labels[rows] == a).any() and (labels[rows] == b).any()):
            continue
        x = prepare(clip_feats[rows], center=True)
        kk = min(k, len(rows) - 1)
        nn_self = nearest(x, x, kk + 1)
        nn_loo = np.stack([[j for j in r if j != q][:kk] for q, r in enumerate(nn_self)])
        y = (labels[rows] == b).astype(np.int64)
        per[f"{classes[a]} | {classes[b]}"] = 1.0 - knn_classify(x, x, nn_loo, y, y, kk, t)["knn_top1"]
    return {"pairs": per, "mean": float(np.mean(list(per.values()))) if per else None, "k": k, "t": t}


def measure(f: np.ndarray, seed: int) -> dict[str, Any]:
    """Every transform measure of one encoder's features (videos, views, D)."""
    v = {name: f[:, j] for j, name in enumerate(VIEWS)}
    return {"arrow_of_time_top1": held_out_accuracy([v["clip"], v["reversed"]], seed),
            "speed_top1": held_out_accuracy([v[s] for s in SPEEDS], seed), **distances(f)}


# ----------------------------------------------------------------------------- the report


def pick_split(data: str | Path, split: str | None) -> str:
    """``split``, else the held-out split of the dataset (test, then val / validation), else train."""
    have = list(read_info(data).get("splits", {}))
    if split is not None:
        if split not in have:
            raise MoquadError(f"split {split!r} is not in {data} (it has {', '.join(have) or 'none'})")
        return split
    return next((s for s in ("test", "val", "validation", "train") if s in have), have[0] if have else "train")


def geometry(encoders: Sequence[Encoder], frames: int | None, size: int | None) -> tuple[int, int]:
    """Clip frames and crop size: as given, else the clip of the first encoder pre-trained by moquad (its
    pre-training clip), else the first encoder's native clip (its backbone row's: torchvision's weights), else the
    config's default clip."""
    first = _clip_owner(encoders)
    clip = encoder_clip(first) if first else dataclasses.asdict(pretrain_clip(None))
    return int(frames or clip["frames"]), int(size or clip["size"])


def encoder_clip(enc: Encoder) -> dict[str, Any] | None:
    """The clip ``enc``'s weights carry (``info["clip"]``; an encoder made by hand with a moquad ``loader`` in its
    info: that pre-training clip; another family's: its native clip, :attr:`Encoder.clip`); None when unknown."""
    if enc.info.get("clip") or enc.info.get("loader"):
        return enc.info.get("clip") or config_clip(enc.info)
    if not enc.clip.stated:
        return None
    c = enc.clip
    return {"frames": c.frames, "size": c.size, "dilations": None, "from": c.source}


def _clip_owner(encoders: Sequence[Encoder]) -> Encoder | None:
    known = [e for e in encoders if encoder_clip(e)]
    return next((e for e in known if encoder_clip(e)["from"] == "pre-training"), known[0] if known else None)


def clip_warnings(encoders: Sequence[Encoder], frames: int | None, size: int | None) -> list[str]:
    """One ``warning:`` line per encoder whose weights carry another clip than the report's (the clip is one for
    every encoder: ``frames`` / ``size`` as given, else :func:`geometry`'s), as the evaluation commands warn."""
    from types import SimpleNamespace

    from moquad.eval.common import clip_warning

    at = geometry(encoders, frames, size)
    given = [f"--{k}" for k, v in (("frames", frames), ("size", size)) if v is not None]
    owner = _clip_owner(encoders)
    who = f"{'/'.join(given)} set{'s' if len(given) == 1 else ''} it" if given else (
        f"the report's clip is {owner.label}'s" if owner else "")
    lines = []
    for enc in encoders:
        clip = encoder_clip(enc)
        if clip:
            trained = PretrainClip(clip["frames"], clip["size"], tuple(clip["dilations"] or ()), DEFAULT_INPUT)
            line = clip_warning(SimpleNamespace(frames=at[0], size=at[1], dilation=None), trained, who=who,
                                encoder=f"encoder {enc.label}", native=not (enc.info.get("clip") or enc.info.get("loader")))
            lines += [line] if line else []
    return lines


def motion_report(data: str | Path, encoders: Sequence[Encoder], *, split: str | None = None, frames: int | None = None,
                  size: int | None = None, dilation: int = 1, max_videos: int | None = None,
                  pairs: Sequence[tuple[str, str]] = (), knn_k: int = 10, seed: int = 0, batch_size: int = 16,
                  workers: int = 0, device: str = "cpu", show: bool = True, threads: int | None = None
                  ) -> dict[str, Any]:
    """The motion report of ``encoders`` (from ``moquad.load_encoder``) on a split of ``data``: features of every
    encoder under every transform -> the result (protocol, per-encoder measures); ``moquad.write_report`` writes
    it. ``show``: print the table. ``threads``: CPU threads of torch while it runs (1 on a busy box: small ops wait
    less at barriers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return _report(data, encoders, split, frames, size, dilation, max_videos, pairs, knn_k, seed, batch_size,
                       workers, device, show)
    finally:
        torch.set_num_threads(before)


def _report(data: str | Path, encoders: Sequence[Encoder], split: str | None, frames: int | None, size: int | None,
            dilation: int, max_videos: int | None, pairs: Sequence[tuple[str, str]], knn_k: int, seed: int,
            batch_size: int, workers: int, device: str, show: bool) -> dict[str, Any]:
    t0 = time.time()
    split = pick_split(data, split)
    sp = Split(data, split)
    sp.check_shards()
    if len({e.label for e in encoders}) != len(encoders) or not encoders:
        raise MoquadError("give one or more encoders with distinct labels (LABEL=PATH)")
    frames, size = geometry(encoders, frames, size)
    for e in encoders:  # before any video is decoded: the one line that says what the encoder takes
        e.probe_clip(frames, size)
    classes = list(read_info(data).get("classes", []))
    pair_ids = resolve_pairs(classes, pairs)
    if pairs and not (sp.label >= 0).any():
        raise MoquadError(f"--pair needs labelled videos; split {split!r} of {data} has no labels")
    rows = np.arange(len(sp))
    if max_videos is not None and len(rows) > max_videos:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_videos, replace=False))
    if len(rows) < 2:
        raise MoquadError(f"split {split!r} of {data} has {len(rows)} video(s); the report needs at least 2")
    feats = transform_features(encoders, sp, rows.tolist(), frames, dilation, size, batch_size, workers, device, show)
    results = {}
    for e in encoders:
        results[e.label] = {**measure(feats[e.label], seed), "feature_dim": int(feats[e.label].shape[-1]),
                            "encoder": e.record()}
        if pair_ids:
            results[e.label]["direction_pairs"] = pair_confusion(feats[e.label][:, 0], sp.label[rows], pair_ids,
                                                                 classes, knn_k)
    short = int((sp.num_frames[rows] < clip_span(frames, 4 * dilation)).sum())
    return {"task": "motion", "data": {"dir": str(Path(data).resolve()), "split": split, "videos": len(rows),
                                       "manifest_checksum": sp.checksum_value},
            "protocol": protocol(frames, dilation, size, seed, knn_k, short), "encoders": results,
            "seconds": round(time.time() - t0, 1)}


def protocol(frames: int, dilation: int, size: int, seed: int, knn_k: int, short: int) -> dict[str, Any]:
    """What the numbers mean (recorded in the JSON)."""
    return {"clip": f"{frames} frames at dilation {dilation}, centred in the video (moquad.data.clip_frames)",
            "frames": frames, "dilation": dilation, "size": size,
            "views": {name: tr.description for name, tr in TRANSFORMS.items()},
            "normalize": "each encoder's own (its family's: the encoder record's normalize)",
            "feature": "each encoder's pooled feature (its family's pooling; moquad: before any projection head), "
                       "eval mode",
            "distance": "cosine distance after subtracting the split's mean clip feature, mean over videos",
            "ratio_to_crop": "distance clip <-> view / distance clip <-> crop (0: invariant; 1: as a crop)",
            "appearance_share": "1 - distance clip <-> still (1: the feature is what one frame shows)",
            "classifiers": f"logistic regression (L-BFGS), train on a seed-{seed} half of the videos, test on the "
                           "other half; arrow of time: clip vs reversed (chance 0.5); speed: 1x/2x/4x (chance 1/3)",
            "direction_pairs": f"weighted kNN (k={knn_k}, T=0.07), leave-one-out among the pair's videos: share "
                               "voted to the partner class (0.5: direction-blind)",
            "short_videos": short, "short_videos_rule": "shorter than the 4x clip: stretched (clip rule)"}


COLUMNS = {  # table column -> (value of one encoder's result, format); words short enough for 80 columns
    "arrow top-1": (lambda r: r["arrow_of_time_top1"], "{:.1%}"),
    "rev. / crop": (lambda r: r["ratio_to_crop"]["reversed"], "{:.2f}"),
    "speed top-1": (lambda r: r["speed_top1"], "{:.1%}"),
    "2x / crop": (lambda r: r["ratio_to_crop"]["speed2"], "{:.2f}"),
    "4x / crop": (lambda r: r["ratio_to_crop"]["speed4"], "{:.2f}"),
    "mirror / crop": (lambda r: r["ratio_to_crop"]["mirror"], "{:.2f}"),
    "appear. share": (lambda r: r["appearance_share"], "{:.2f}"),
    "pair conf.": (lambda r: (r.get("direction_pairs") or {}).get("mean"), "{:.1%}"),
}


def table(result: dict[str, Any]) -> Table:
    """One row per encoder, one column per measure (:data:`COLUMNS`). A header wraps between its words, never
    inside one (each column is as wide as its longest word or its widest value)."""
    d, p = result["data"], result["protocol"]
    t = Table(title=f"Motion report: {d['videos']} videos of {d['split']} ({p['frames']} frames, {p['size']} px); "
                    "chance: arrow 50%, speed 33%, pair confusion 50%; rev.: reversed; appear.: appearance; "
                    "ratios: 1 = as different as another crop")
    t.add_column("encoder", overflow="fold")
    rows = {label: [COLUMNS[c][0](r) for c in COLUMNS] for label, r in result["encoders"].items()}
    text = {label: ["–" if v is None else COLUMNS[c][1].format(v) for c, v in zip(COLUMNS, cells)]
            for label, cells in rows.items()}
    for j, name in enumerate(COLUMNS):
        widest = max([len(w) for w in name.split()] + [len(cells[j]) for cells in text.values()])
        t.add_column(name, justify="right", width=widest)  # as narrow as its longest word: room for the labels
    for label, cells in text.items():
        t.add_row(label, *cells)
    return t


def report(cfg: MotionConfig, encoders: Sequence[str], show: bool = True) -> dict[str, Any]:
    """The motion report protocol (``moquad motion``, row ``motion`` of ``moquad.eval.protocols.PROTOCOLS``): the
    encoders the specs name (:func:`load_encoder`), one warning line on stderr per encoder whose weights carry
    another clip than the report's (:func:`clip_warnings`), the result written to ``cfg.out``
    (:func:`write_report`; its paths under ``json`` and ``png``)."""
    import sys

    pairs = [parse_pair(p) for p in cfg.pair or ()]
    loaded = [load_encoder(spec) for spec in encoders]
    at = geometry(loaded, cfg.frames, cfg.size)
    for e in loaded:  # a clip an encoder cannot take: its one error line, before any warning
        e.check_clip(*at)
    for line in clip_warnings(loaded, cfg.frames, cfg.size):
        print(line, file=sys.stderr, flush=True)
    result = motion_report(cfg.data, loaded, split=cfg.split, frames=cfg.frames, size=cfg.size, dilation=cfg.dilation,
                           max_videos=cfg.max_videos, pairs=pairs, knn_k=cfg.knn_k, seed=cfg.seed,
                           batch_size=cfg.batch_size, workers=cfg.workers, device=cfg.device, show=show,
                           threads=cfg.threads)
    json_path, png = write_report(result, cfg.out, show=show)
    return {**result, "json": str(json_path), "png": str(png)}


def write_report(result: dict[str, Any], out: str | Path, show: bool = True) -> tuple[Path, Path]:
    """OUT/motion.json (+ .txt, the table) and OUT/motion.png; the table is printed unless ``show`` is False. The
    figure is drawn first: a figure that cannot be drawn leaves no result behind (motion.json means the report is
    whole)."""
    from moquad.eval.motion_plot import plot
    from moquad.eval.report import write_result

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(result, out / "motion.png")
    return write_result(result, out / "motion.json", [table(result)], quiet=not show), png
