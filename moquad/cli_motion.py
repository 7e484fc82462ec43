"""The ``moquad motion`` command: the motion report (:mod:`moquad.eval.motion`) of one or more encoders.

Registered on the main app by ``moquad.cli``; same conventions: parse options, call ONE function.
"""

from __future__ import annotations

import typer

from moquad import config as C
from moquad.cli_common import Flag, _need_dir, config_command
from moquad.errors import MoquadError
from moquad.models.backbones import TORCHVISION_ARCHS

app = typer.Typer()

MOTION_FLAGS = ("encoders", "checkpoint", Flag("data", required=True), *map(Flag, ("out", "split", "frames", "size", "dilation",
                "max_videos")), Flag("pair", multiple=True),
                *map(Flag, ("knn_k", "seed", "batch_size", "workers", "device", "threads")))


def _warn_clip(encoders: list, cfg: C.MotionConfig) -> None:
    """One warning line per moquad encoder pre-trained at another clip than the report's (the clip is one for
    every encoder: --frames/--size, else the first moquad encoder's)."""
    import sys
    from types import SimpleNamespace

    from moquad.eval.clips import pretrain_clip
    from moquad.eval.common import clip_warning
    from moquad.eval.motion import geometry

    frames, size = geometry(encoders, cfg.frames, cfg.size)
    first = next((e for e in encoders if e.info.get("loader")), None)
    given = [f"--{k}" for k in ("frames", "size") if getattr(cfg, k) is not None]
    who = f"{'/'.join(given)} set{'s' if len(given) == 1 else ''} it" if given else (
        f"the report's clip is {first.label}'s" if first else "")
    for enc in encoders:
        if enc.info.get("loader"):
            line = clip_warning(SimpleNamespace(frames=frames, size=size, dilation=None), pretrain_clip(enc.info),
                                who=who, encoder=f"encoder {enc.label}")
            if line:
                print(line, file=sys.stderr, flush=True)


@config_command(app, "motion", C.MotionConfig, MOTION_FLAGS, epilog=(
    "Example: moquad motion --data data/shards random=runs/random/checkpoints/last.pt runs/simclr/checkpoints/last.pt "
    "runs/moquad/checkpoints/last.pt r3d_18:r3d_18-kinetics.pth --out runs/motion  (writes motion.json, motion.txt "
    "and motion.png)"))
def motion(
    cfg: C.MotionConfig,
    encoders: list[str] = typer.Argument(None, help="Encoders, each [LABEL=][ARCH:]PATH: a moquad checkpoint "
                                         "(RUN/checkpoints/last.pt), an exported .safetensors, or ARCH:WEIGHTS for a "
                                         f"torchvision video model (ARCH: {', '.join(TORCHVISION_ARCHS)}).",
                                         show_default=False),
    checkpoint: list[str] = typer.Option(None, "--checkpoint", help="An encoder as ENCODERS takes it, repeatable; "
                                         "reported after those given as arguments.", show_default=False),
) -> None:
    """Motion report: arrow of time, speed, mirror, appearance share and direction pairs of frozen encoders."""
    encoders = [*(encoders or ()), *(checkpoint or ())]
    if not encoders:
        raise MoquadError("motion needs at least one encoder: RUN/checkpoints/last.pt as an argument or --checkpoint")
    _need_dir(cfg.data, "data folder", "pass the --out folder of `moquad preprocess`")
    from moquad.eval.motion import load_encoder, motion_report, parse_pair, write_report

    pairs = [parse_pair(p) for p in cfg.pair or ()]
    loaded = [load_encoder(spec) for spec in encoders]
    _warn_clip(loaded, cfg)
    result = motion_report(cfg.data, loaded, split=cfg.split, frames=cfg.frames, size=cfg.size, dilation=cfg.dilation,
                           max_videos=cfg.max_videos, pairs=pairs, knn_k=cfg.knn_k, seed=cfg.seed,
                           batch_size=cfg.batch_size, workers=cfg.workers, device=cfg.device, threads=cfg.threads)
    json_path, png = write_report(result, cfg.out)
    typer.echo(f"wrote {json_path}, {json_path.with_suffix('.txt')} and {png} ({result['seconds']:.0f} s)")
