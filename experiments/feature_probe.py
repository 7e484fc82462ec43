"""Why is MoQuad's retrieval gain small on the ``directions`` family? Measurements of frozen features.

For every run folder of ``experiments/synth_evidence.py`` (``data/shards``, ``{random,simclr,moquad}/checkpoints/
last.pt``, ``quickstart.json``) and every checkpoint, the demo's test views (``eval/cpu_demo.yaml``: 5 clips of
8 frames, 32 px, centre crop) of both splits go through the tiny backbone once, and several video features are
read from that pass (each the mean over the clips, as ``moquad extract`` does):

  pooled       global average of block 4 over (T, H, W): the feature moquad evaluates (checked against the cache)
  head         the projection head's output (what the contrastive loss sees)
  block3       global average of block 3 (the stage before the last)
  time-concat  block 4 averaged over (H, W) only, its 2 time steps concatenated (no temporal pooling)
  time-diff    block 4 averaged over (H, W): last time step minus first
  block3-time  block 3 averaged over (H, W), its 4 time steps concatenated
  pooled-static  pooled minus the pooled feature of the static clips below (appearance removed; a diagnostic)

and the same for the STATIC version of every clip: its middle frame repeated, i.e. the same appearance and no
motion. Three tables per run folder, then mean +- std over the folders of one family:

1. Diagnostics of a feature (train split fits, test split scores): share of the variance on the first principal
   component(s); share of the variance explained (R^2 of a least-squares fit on train, scored on test) by the
   class, by the static clip's feature, and (directions family) by the class-free camera drift (velocity and
   object speed, to second order), re-drawn from the generator's seed; the "motion part" = the share of the
   between-video variation the static clip does NOT reproduce (no fitting), and the R^2 of that part (video
   feature minus static feature) by the class, by the camera drift, and by the speeds alone (camera and object
   speed, no direction); cosine between a video's feature and its static version's (raw and centred).
2. Retrieval hit@1 and weighted-kNN top-1 of the pooled feature after: L2 only (moquad's default), centring
   (``moquad retrieve --center``), standardising with the train mean/std, removing the top 1/2/4 principal
   components.
3. Each feature choice: hit@1 and kNN top-1 (L2 only, standardised) and the linear probe (as ``linear --fast``).

Also printed: the largest difference between the pooled feature here and ``moquad extract``'s cache (the
probe reads what moquad evaluates), and the Fig. 4 ranks of each run's last 20 % of steps.

    nice python experiments/feature_probe.py runs/evidence/directions/seed0 --out runs/probe/probe.json
    nice python experiments/feature_probe.py RUN --checkpoint "warm-up 0.2=runs/w/checkpoints/last.pt"

One torch thread (the machine is shared): ~15 s per checkpoint on 2 cores, 3 checkpoints per run folder.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from moquad import config as C
from moquad import settings, synth
from moquad.data.augment import normalize
from moquad.data.store import Split
from moquad.eval.clips import eval_clips
from moquad.eval.common import with_clip
from moquad.eval.features import read_features
from moquad.eval.linear import fit_logistic
from moquad.eval.retrieve import hits_at, knn_classify
from moquad.eval.search import nearest, prepare
from moquad.recipes import find_recipe
from moquad.record import Record, add_argument
from moquad.train.checkpoint import load_model
from moquad.train.log import read_log

METHODS = {"random init": "random", "simclr": "simclr", "moquad": "moquad"}  # label -> folder in a run
FEATURES = ("pooled", "head", "block3", "time-concat", "time-diff", "block3-time", "pooled-static")
TRANSFORMS = ("L2 (default)", "centre", "standardise", "drop PC1", "drop PC1-2", "drop PC1-4")


# ----------------------------------------------------------------------------- features


def clip_features(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every feature variant of a batch of normalised clips (N, 3, T, H, W) from one pass of the tiny net."""
    maps, h = [], x
    for block in model.backbone.features:
        h = block(h)
        maps.append(h)
    b3, b4 = maps[2].mean((3, 4)), maps[3].mean((3, 4))  # (N, C, T): spatial average only
    pooled = model.backbone.pool(maps[3]).flatten(1)
    return {"pooled": pooled, "head": model.head(pooled), "block3": b3.mean(2), "time-concat": b4.flatten(1),
            "time-diff": b4[..., -1] - b4[..., 0], "block3-time": b3.flatten(1)}


@torch.no_grad()
def video_features(model: torch.nn.Module, split: Split, cfg: C.EvalConfig) -> dict[str, np.ndarray]:
    """{variant: (videos, D)} and {"static/" + variant: ...}, each the mean over the video's test views."""
    out: dict[str, list[np.ndarray]] = defaultdict(list)
    for i in range(len(split)):
        clips = eval_clips(split, i, cfg.frames, cfg.dilation, cfg.num_clips, cfg.size, cfg.crops)
        mid = clips.shape[2] // 2
        static = clips[:, :, mid : mid + 1].expand_as(clips)  # one frame repeated: appearance without motion
        for tag, x in (("", clips), ("static/", static)):
            for name, f in clip_features(model, normalize(x, "cpu")).items():
                out[tag + name].append(f.mean(0).double().numpy())
    feats = {k: np.stack(v) for k, v in out.items()}
    feats["pooled-static"] = feats["pooled"] - feats["static/pooled"]  # the motion part of the pooled feature
    return feats


def check_cache(run: Path, label: str, split: str, pooled: np.ndarray) -> float | None:
    """Largest |difference| between our pooled feature and the cached one of ``moquad extract`` (None: no cache)."""
    path = run / "eval" / label.replace(" ", "_") / "features" / f"{split}.lance"
    if not path.exists():
        return None
    return float(np.abs(read_features(path)["embedding"] - pooled).max())


def camera_drift(run: Path, split: Split) -> np.ndarray | None:
    """Per video of ``split``: (dy, dx, object speed) in px per frame, re-drawn from the synth seed (directions
    only). The draws mirror the first lines of ``synth._render_directions``; frame 0 of every video is compared
    with the stored video so a change there cannot go unnoticed."""
    s = json.loads((run / "quickstart.json").read_text())
    if s.get("kind", "types") != "directions":
        return None
    drawn, original = {}, synth._render_directions

    def spy(name, background, rng, size, frames, objects):  # noqa: ANN001, ANN202
        r = np.random.Generator(type(rng.bit_generator)())
        r.bit_generator.state = rng.bit_generator.state
        speed = r.uniform(1.2, 1.6) * size / 64
        drift, heading = r.uniform(0, synth.CAMERA_SPEED) * size / 64, r.uniform(0, 2 * math.pi)
        video = original(name, background, rng, size, frames, objects)
        return video, (drift * math.sin(heading), drift * math.cos(heading), speed)

    synth._render_directions = spy
    try:
        for rel, _, _, (video, params) in synth.synth_videos(s["classes"], s["per_class"], s["size"], 2, s["seed"],
                                                              s["objects"], "directions"):
            drawn[Path(rel).stem] = (video[0], params)
    finally:
        synth._render_directions = original
    gap = max(float(np.abs(drawn[v][0].astype(float) - split.read_frames(i, [0])[0]).mean())
              for i, v in enumerate(split.video_id[:5]))
    if gap > 12:  # codec loss is a few grey levels; another video differs by tens
        raise RuntimeError(f"re-drawn synth videos do not match {run} (mean |diff| {gap:.1f}); synth changed?")
    return np.array([drawn[v][1] for v in split.video_id])


# ----------------------------------------------------------------------------- measures


def retrieval(q: np.ndarray, ql: np.ndarray, g: np.ndarray, gl: np.ndarray, cfg: C.EvalConfig) -> dict[str, float]:
    """hit@1 and weighted-kNN top-1 (moquad's exact search and DINO vote) of prepared features."""
    nn = nearest(q, g, cfg.knn_k, cuts=[1, cfg.knn_k])
    knn = knn_classify(q, g, nn, ql, gl, cfg.knn_k, cfg.knn_t)
    return {"hit@1": hits_at(nn, ql, gl, [1])["hit@1"], "knn_top1": knn["knn_top1"]}


def linear_top1(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray) -> float:
    """``moquad linear --fast``: logistic regression on train-standardised features, test top-1."""
    mean, std = xtr.mean(0), xtr.std(0) + 1e-6
    clf = fit_logistic((xtr - mean) / std, ytr, int(ytr.max()) + 1, C.LinearConfig().l2)
    with torch.no_grad():
        pred = clf(torch.as_tensor((xte - mean) / std)).argmax(1).numpy()
    return float((pred == yte).mean())


def transform(name: str, tr: np.ndarray, te: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) features prepared for cosine retrieval by one of ``TRANSFORMS`` (train statistics only)."""
    if name.startswith("L2"):
        return prepare(tr, False), prepare(te, False)
    if name == "centre":  # moquad retrieve --center: each split minus its own mean
        return prepare(tr, True), prepare(te, True)
    if name == "standardise":
        m, s = tr.mean(0), tr.std(0) + 1e-6
        return prepare((tr - m) / s, False), prepare((te - m) / s, False)
    if name.startswith("drop PC"):
        k = int(name[-1])
        m = tr.mean(0)
        v = np.linalg.svd(tr - m, full_matrices=False)[2][:k]  # top-k principal directions of train
        return tuple(prepare((x - m) - (x - m) @ v.T @ v, False) for x in (tr, te))  # type: ignore[return-value]
    raise ValueError(name)


def r2(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray) -> float:
    """Out-of-sample share of the variance of ``y`` explained by an affine least-squares fit on ``x`` (train)."""
    a = np.c_[xtr, np.ones(len(xtr))]
    w = np.linalg.lstsq(a, ytr, rcond=None)[0]
    err = yte - np.c_[xte, np.ones(len(xte))] @ w
    return float(1 - (err**2).sum() / ((yte - ytr.mean(0)) ** 2).sum())


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((prepare(a, False) * prepare(b, False)).sum(1)))


def diagnostics(tr: dict, te: dict, ytr: np.ndarray, yte: np.ndarray, cam: tuple | None, name: str) -> dict:
    """Table 1 for feature ``name`` (module docstring); "motion part" = the feature minus its static version's."""
    f, s = tr[name], tr["static/" + name]
    ev = np.linalg.eigvalsh(np.cov(f.T))[::-1]
    onehot = np.eye(int(ytr.max()) + 1)
    fa, sa = np.r_[f, te[name]], np.r_[s, te["static/" + name]]
    fc, sc = fa - fa.mean(0), sa - sa.mean(0)
    d = {"PC1": ev[0] / ev.sum(), "PC1-4": ev[:4].sum() / ev.sum(),
         "motion part": ((fc - sc) ** 2).sum() / (fc**2).sum(),  # variation the static clip does NOT reproduce
         "R2 class": r2(onehot[ytr], f, onehot[yte], te[name]),
         "R2 static": r2(s, f, te["static/" + name], te[name])}
    m_tr, m_te = f - s, te[name] - te["static/" + name]
    d["motion part: R2 class"] = r2(onehot[ytr], m_tr, onehot[yte], m_te)
    if cam is not None:
        poly = [np.c_[c, c[:, :2] ** 2, c[:, :1] * c[:, 1:2], np.hypot(c[:, 0], c[:, 1])] for c in cam]
        speeds = [np.c_[np.hypot(c[:, 0], c[:, 1]), c[:, 0] ** 2 + c[:, 1] ** 2, c[:, 2], c[:, 2] ** 2] for c in cam]
        d["R2 camera"] = r2(poly[0], f, poly[1], te[name])
        d["motion part: R2 camera"] = r2(poly[0], m_tr, poly[1], m_te)
        d["motion part: R2 speeds"] = r2(speeds[0], m_tr, speeds[1], m_te)
    d["cos(video, static)"] = cos(fa, sa)
    d["centred cos"] = cos(fc, sc)
    return {k: float(v) for k, v in d.items()}


def score(t: str, tr: dict, te: dict, name: str, ytr: np.ndarray, yte: np.ndarray, cfg: C.EvalConfig) -> dict:
    """Retrieval of test queries against the train gallery, feature ``name`` prepared by transform ``t``."""
    g, q = transform(t, tr[name], te[name])
    return retrieval(q, yte, g, ytr, cfg)


def fig4_ranks(ckpt: Path) -> dict[str, float | None]:
    """The paper's Fig. 4 diagnostic of the checkpoint's run (``log.jsonl`` beside ``checkpoints/``): mean rank
    of the AD-Pos and of the Intra-Negs among each anchor's candidates over the last 20 % of steps."""
    rows = read_log(ckpt.parent.parent / "log.jsonl")
    last = rows[int(0.8 * len(rows)):]
    mean = {k: [r[k] for r in last if r.get(k) is not None] for k in ("rank_ad_pos", "rank_intra_neg")}
    return {k: (statistics.mean(v) if v else None) for k, v in mean.items()}


def probe_checkpoint(ckpt: Path, run: Path, label: str, splits: dict, cam: tuple | None, cfg: C.EvalConfig) -> dict:
    """All three tables' numbers for one checkpoint."""
    model, _ = load_model(ckpt)
    model.eval()
    if not hasattr(model.backbone, "features"):
        raise SystemExit(f"{ckpt}: the probe reads the tiny backbone's blocks; pre-train with --backbone tiny")
    tr, te = (video_features(model, splits[s], cfg) for s in ("train", "test"))
    ytr, yte = splits["train"].label, splits["test"].label
    res: dict = {"cache_max_diff": [check_cache(run, label, s, f["pooled"]) for s, f in (("train", tr), ("test", te))],
                 "fig4": fig4_ranks(ckpt)}
    res["diagnostics"] = {n: diagnostics(tr, te, ytr, yte, cam, n) for n in ("pooled", "head", "block3")}
    res["transforms"] = {t: score(t, tr, te, "pooled", ytr, yte, cfg) for t in TRANSFORMS}
    res["features"] = {}
    for n in FEATURES:
        l2, st = score("L2", tr, te, n, ytr, yte, cfg), score("standardise", tr, te, n, ytr, yte, cfg)
        res["features"][n] = {"hit@1": l2["hit@1"], "knn_top1": l2["knn_top1"], "hit@1 std": st["hit@1"],
                              "knn_top1 std": st["knn_top1"], "linear_top1": linear_top1(tr[n], ytr, te[n], yte),
                              "dim": tr[n].shape[1]}
    return res


# ----------------------------------------------------------------------------- tables


PLAIN = {"cos(video, static)", "centred cos"}  # shown as they are; every other measure in %


def _cell(vals: list[float], col: str) -> str:
    if col == "dim":
        return str(int(vals[0]))
    v, fmt = (vals, "{:.3f}") if col in PLAIN else ([100 * x for x in vals], "{:.1f}")
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(statistics.mean(v))} ± {fmt.format(statistics.stdev(v))}"


def md_table(title: str, results: list[dict], section: str, rows: tuple[str, ...]) -> str:
    """Markdown table: one row per (checkpoint, row key), columns = the measures; mean ± std over ``results``."""
    labels = list(results[0])
    cols = list(results[0][labels[0]][section][rows[0]])
    lines = [f"**{title}**", "", f"| checkpoint | {section[:-1]} | " + " | ".join(cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for label in labels:
        for r in rows:
            cells = [_cell([res[label][section][r][c] for res in results], c) for c in cols]
            lines.append(f"| {label} | {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report(title: str, results: list[dict]) -> str:
    """The three tables (mean ± std over ``results`` when several)."""
    return "\n".join([
        md_table(f"{title}: 1. diagnostics (% of the feature's variance; R2 fitted on train, scored on test)",
                 results, "diagnostics", ("pooled", "head", "block3")),
        md_table(f"{title}: 2. pooled feature, retrieval after a transform (%)", results, "transforms", TRANSFORMS),
        md_table(f"{title}: 3. feature choice (%; std = standardised with the train mean/std)", results, "features",
                 FEATURES),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders of experiments/synth_evidence.py")
    ap.add_argument("--checkpoint", action="append", default=[], metavar="LABEL=PATH",
                    help="another checkpoint to probe on each run folder's data (repeatable)")
    ap.add_argument("--recipe", default="eval/cpu_demo.yaml", help="evaluation recipe of the test views")
    ap.add_argument("--out", type=Path, default=None, help="also write every number to this JSON file")
    add_argument(ap, "feature_probe")
    args = ap.parse_args()
    rec = Record("feature_probe")
    torch.set_num_threads(1)
    extra = dict(c.split("=", 1) for c in args.checkpoint)
    by_kind: dict[str, list[dict]] = defaultdict(list)
    everything = {}
    for run in args.runs:
        # the clip settings the recipe leaves unset: the paper's (no checkpoint here), dilation 2
        cfg = with_clip(settings.resolve(C.EvalConfig(), find_recipe(args.recipe), {"data": str(run / "data" / "shards")}))
        splits = {s: Split(cfg.data, s) for s in ("train", "test")}
        cams = [camera_drift(run, splits[s]) for s in ("train", "test")]
        cam = None if cams[0] is None else tuple(cams)
        ckpts = {label: run / d / "checkpoints" / "last.pt" for label, d in METHODS.items()} | extra
        missing = [label for label, p in ckpts.items() if not Path(p).is_file()]
        if missing:
            print(f"{run}: no checkpoint yet for {', '.join(missing)}; probing the others")
        ckpts = {label: p for label, p in ckpts.items() if label not in missing}
        res = {label: probe_checkpoint(Path(p), run, label, splits, cam, cfg) for label, p in ckpts.items()}
        kind = json.loads((run / "quickstart.json").read_text()).get("kind", "types")
        print(report(f"{kind} {run.name}", [res]))
        print("pooled feature vs moquad's cache, max |diff| (train, test):",
              {k: v["cache_max_diff"] for k, v in res.items()})
        print("Fig. 4 ranks of AD-Pos / Intra-Negs (of 63, 1 = nearest), last 20 % of steps:",
              {k: v["fig4"] for k, v in res.items()}, "\n", flush=True)
        by_kind[kind].append(res)
        everything[str(run)] = res
    for kind, results in by_kind.items():
        if len(results) > 1:
            print(report(f"{kind}, mean ± std over {len(results)} run folders", results))
    rec.figures.update(everything)
    rec.write(args.record)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
