"""Training-step time per video of each method's main stage, same backbone and batch: SimCLR (the ladder's base,
2 clips per video), MoQuad (4 clips), the momentum base MoCo (2 clips: the anchor through the online network,
the positive through the momentum encoder, no gradient) and MoQuad on it (4 clips: 3 of them momentum keys).

A MoQuad step pushes twice the clips of a SimCLR step, so 2x is the floor; the table reports the ratio of each
method to SimCLR. A momentum method runs only the anchors backward, so its step can cost less than SimCLR's.
Timed: EMA update (momentum methods) + forward + loss + backward + optimizer step on random normalised clips (no
data loading), median of ``--repeats`` after one warm-up step, the methods' steps interleaved so load affects all
alike; the optimizer is the one the backbone's recipes use (LARS for the CNNs, ``adamw_vit`` for the
transformers, i.e. the backbone rows with CAM tokens). Run: ``nice python benchmarks/bench_step.py``; the tables
go to ``docs/results/bench_step.json`` (``--record``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from moquad.config import PretrainConfig
from moquad.models import build_model
from moquad.record import Record, add_argument
from moquad.train.loop import forward_loss
from moquad.train.methods import METHODS
from moquad.train.momentum import Online
from moquad.train.momentum import build as build_momentum
from moquad.train.optimizers import make_optimizer, pretrain_optimizer

ROWS = ("simclr", "moquad", "moco", "moco_moquad")  # rows of METHODS, timed at their main (last) stage
QUAD = ("anchor", "positive", "intra_negative", "intra_negative")


def _setup(backbone: str, method: str, batch: int, frames: int, size: int, device: str):
    torch.manual_seed(0)
    cfg, _ = pretrain_optimizer(PretrainConfig(backbone=backbone, queue_size=4096))  # the backbone's optimizer
    model = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden).to(device).train()
    m = METHODS[method].configured(cfg)
    momentum = build_momentum(m.momentum, model, cfg) if m.momentum is not None else None
    if momentum is not None and momentum.predictor is not None:  # as the trainer: the optimizer trains it too
        model = Online(model, momentum.predictor)
    stage = m.stages[-1]
    roles = stage.plan(cfg.loader).roles
    x = torch.randn(batch, len(roles), 3, frames, size, size, device=device)
    opt = make_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay)
    return model, opt, x, roles, stage.loss, momentum, stage.params(cfg)


def _step(run, device: str, step: int) -> float:
    model, opt, x, roles, loss_fn, momentum, params = run
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    if momentum is not None:
        momentum.update(model.model if isinstance(model, Online) else model, step, 1000)
    video = torch.arange(x.shape[0], device=device) + step * x.shape[0]
    loss, _ = forward_loss(model, x, roles, loss_fn, video=video, momentum=momentum, **params)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def time_steps(backbone: str, batch: int, frames: int, size: int, repeats: int, device: str) -> dict[str, float]:
    """Median seconds per step of each method (steps interleaved)."""
    runs = {m: _setup(backbone, m, batch, frames, size, device) for m in ROWS}
    times: dict[str, list[float]] = {m: [] for m in runs}
    for r in range(repeats + 1):
        for method, run in runs.items():
            t = _step(run, device, r)
            if r:  # first step is warm-up
                times[method].append(t)
    return {m: statistics.median(v) for m, v in times.items()}


def time_loss(batch: int, mode: str, repeats: int, device: str, dim: int = 128) -> float:
    """Median seconds of loss forward + backward alone on (batch, V, dim) projections."""
    from moquad.train.losses import moquad_loss

    z = torch.randn(batch, 4 if mode == "moquad" else 2, dim, device=device, requires_grad=True)
    out = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        loss = moquad_loss(z, QUAD if mode == "moquad" else QUAD[:2], tau=0.1, hard_beta=0.01, hard_alpha=1.5)[0]
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["tiny:8:8:32", "r3d_18:4:8:32", "swin3d_t:4:8:32", "mvit_v2_s:4:8:32"],
        help="backbone:batch:frames:size entries",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    add_argument(ap, "bench_step")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rec = Record("bench_step")
    rec.figures.update(device=args.device, threads=torch.get_num_threads(), repeats=args.repeats)
    rows = []
    for entry in args.configs:
        name, batch, frames, size = entry.split(":")
        batch, frames, size = int(batch), int(frames), int(size)
        med = time_steps(name, batch, frames, size, args.repeats, args.device)
        rec.figures[entry] = {m: med[m] / batch * 1e3 for m in ROWS}  # ms per video
        rows.append([name, f"{batch} x {frames}x{size}",
                     *(f"{med[m] / batch * 1e3:.1f} ({med[m] / med['simclr']:.2f}x)" for m in ROWS)])
    rec.table("step", ["backbone", "batch x clip", *ROWS], rows, align="ll" + "r" * len(ROWS),
              title=f"{args.device}, {torch.get_num_threads()} torch threads, median of {args.repeats} steps: "
                    "ms per video (ratio to simclr)")
    loss = {mode: time_loss(256, mode, args.repeats, args.device) * 1e3 for mode in ("simclr", "moquad")}
    rec.figures["loss ms at batch 256"] = loss
    rec.table("loss", ["loss", "ms per step", "ratio"], [[m, f"{v:.2f}", f"{v / loss['simclr']:.2f}x"]
                                                        for m, v in loss.items()],
              title="The loss alone (forward + backward, 128-d projections), a global batch of 256 videos")
    rec.write(args.record)

if __name__ == "__main__":
    main()
