"""Training-step time per video: MoQuad (4 clips per video) vs SimCLR (2 clips), same backbone and batch.

A MoQuad step pushes twice the clips of a SimCLR step, so 2x is the floor; the table reports the
overhead beyond it (loss with intra/inter negatives and hard mining, bigger similarity matrix).
Timed: forward + loss + backward + optimizer step on random normalised clips (no data loading), median
of ``--repeats`` after one warm-up step; the optimizer is the one the backbone's recipes use (LARS for the CNNs,
``adamw_vit`` for the transformers, i.e. the backbone rows with CAM tokens). Run:
``nice python benchmarks/bench_step.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from moquad.config import PretrainConfig
from moquad.models import BACKBONES, build_model
from moquad.train.loop import forward_loss
from moquad.train.optimizers import make_optimizer

QUAD = ("anchor", "ad_pos", "intra_neg", "ad_intra_neg")  # simclr (the ladder base): QUAD[:2] with a plain "pos"


def _setup(backbone: str, mode: str, batch: int, frames: int, size: int, device: str):
    torch.manual_seed(0)
    cfg = PretrainConfig(backbone=backbone)
    model = build_model(cfg.backbone, cfg.proj_dim, cfg.proj_hidden).to(device).train()
    transformer = BACKBONES[backbone].tokens is not None
    opt = make_optimizer(model, "adamw_vit" if transformer else "lars", 1e-4 if transformer else 0.1, 1e-6)
    x = torch.randn(batch, 4 if mode == "moquad" else 2, 3, frames, size, size, device=device)
    return model, opt, x


def _step(model, opt, x, mode: str, device: str) -> float:
    names = QUAD if mode == "moquad" else ("anchor", "pos")
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    loss, _ = forward_loss(model, x, names, "moquad", tau=0.1, hard_beta=0.01, hard_alpha=1.5)  # simclr: the ladder's base
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def time_steps(
    backbone: str, batch: int, frames: int, size: int, repeats: int, device: str
) -> dict[str, float]:
    """Median seconds per step for each mode; SimCLR and MoQuad steps alternate so load affects both alike."""
    runs = {m: _setup(backbone, m, batch, frames, size, device) for m in ("simclr", "moquad")}
    times: dict[str, list[float]] = {m: [] for m in runs}
    for r in range(repeats + 1):
        for mode, (model, opt, x) in runs.items():
            t = _step(model, opt, x, mode, device)
            if r:  # first step is warm-up
                times[mode].append(t)
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
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, median of {args.repeats} steps\n")
    header = (
        f"{'backbone':<12} {'batch':>5} {'clip':>10} {'SimCLR ms/video':>16} {'MoQuad ms/video':>16} "
        f"{'ratio':>6} {'overhead beyond 2x':>19}"
    )
    print(header)
    print("-" * len(header))
    for entry in args.configs:
        name, batch, frames, size = entry.split(":")
        batch, frames, size = int(batch), int(frames), int(size)
        med = time_steps(name, batch, frames, size, args.repeats, args.device)
        sim, quad = med["simclr"] / batch, med["moquad"] / batch
        ratio = quad / sim
        print(
            f"{name:<12} {batch:>5} {f'{frames}x{size}px':>10} {sim * 1e3:>16.1f} {quad * 1e3:>16.1f} "
            f"{ratio:>6.2f} {100 * (ratio / 2 - 1):>18.1f}%"
        )

    print("\nloss alone (forward + backward, 128-d projections), global batch of 256 videos:")
    for mode in ("simclr", "moquad"):
        print(f"  {mode:<7} {time_loss(256, mode, args.repeats, args.device) * 1e3:8.2f} ms per step")


if __name__ == "__main__":
    main()
