"""The ``moquad motion`` command: the motion report (:mod:`moquad.eval.motion`) of one or more encoders.

Registered on the main app by ``moquad.cli``; same conventions: parse options, call ONE function.
"""

from __future__ import annotations

import typer

from moquad.cli_common import _friendly, _need_dir

app = typer.Typer()


@app.command(epilog="Example: moquad motion --data data/shards random=runs/random/checkpoints/last.pt "
             "runs/simclr/checkpoints/last.pt runs/moquad/checkpoints/last.pt r3d_18:r3d_18-kinetics.pth --out "
             "runs/motion  (writes motion.json, motion.txt and motion.png)")
@_friendly
def motion(
    encoders: list[str] = typer.Argument(..., help="Encoders, each [LABEL=][ARCH:]PATH: a moquad checkpoint "
                                         "(RUN/checkpoints/last.pt), an exported .safetensors, or ARCH:WEIGHTS for a "
                                         "torchvision video model (ARCH: r3d_18, mc3_18, r2plus1d_18, s3d)."),
    data: str = typer.Option(..., help="Shard folder of `moquad preprocess`."),
    out: str = typer.Option("motion", help="Folder for motion.json, motion.txt and motion.png."),
    split: str | None = typer.Option(None, help="Split to measure (default: test, else val / validation, else train)."),
    frames: int | None = typer.Option(None, help="Frames per clip (default: the first checkpoint's pre-training "
                                      "clip, else 16)."),
    size: int | None = typer.Option(None, help="Crop size (default: the first checkpoint's, else 112)."),
    dilation: int = typer.Option(1, help="Frame step of the 1x clip (2x and 4x double and quadruple it)."),
    max_videos: int | None = typer.Option(None, help="Measure a seeded random subset of at most this many videos."),
    pair: list[str] = typer.Option([], help="A class pair differing only by direction, 'A|B' (repeatable); built-in "
                                   "SSv2 and synthetic direction pairs are added when the split has them."),
    knn_k: int = typer.Option(10, help="Neighbours voting in the direction-pair kNN."),
    seed: int = typer.Option(0, help="Seed of the train / test halves of the classifiers."),
    batch_size: int = typer.Option(16, help="Views per forward pass."),
    workers: int = typer.Option(0, help="Decoding worker processes."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    threads: int | None = typer.Option(None, help="CPU threads of torch (default: torch's; 1 on a busy machine)."),
) -> None:
    """Motion report: arrow of time, speed, mirror, appearance share and direction pairs of frozen encoders."""
    _need_dir(data, "data folder", "pass the --out folder of `moquad preprocess`")
    from moquad.eval.motion import load_encoder, motion_report, parse_pair, write_report

    pairs = [parse_pair(p) for p in pair]
    loaded = [load_encoder(spec) for spec in encoders]
    result = motion_report(data, loaded, split=split, frames=frames, size=size, dilation=dilation,
                           max_videos=max_videos, pairs=pairs, knn_k=knn_k, seed=seed, batch_size=batch_size,
                           workers=workers, device=device, threads=threads)
    json_path, png = write_report(result, out)
    typer.echo(f"wrote {json_path}, {json_path.with_suffix('.txt')} and {png} ({result['seconds']:.0f} s)")
