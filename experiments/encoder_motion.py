"""The motion report of every encoder family at random initialisation: the table of the "Evaluate any encoder" page.

Random initialisation is all this script measures: no weights are downloaded. It shows what the report reads of
each architecture before any training (the floor a trained encoder of that family is compared with), and that
every family runs the report end to end. A user with weights runs the same command on them (the page gives it).

Data: the real clips beside the checkout (``../shared/data/real-videos``: 19 videos of people, sport and street
scenes), preprocessed once to ``WORK/shards`` (short side 96, one split ``test``). Every encoder sees the same
pixels: one clip of ``--frames`` frames of ``--size`` px for all (the report's rule), here 16 x 64 so that the
whole run fits a few minutes of one CPU core.

Encoders (:data:`SMALL`): each Hugging Face family is its own ``transformers`` class at reduced width and depth
(``hidden_size`` 192, 4 layers, 3 heads, patch 16, a 16-frame 64 px clip: the ViT-Ti width), randomly initialised
(seed 0) and written with ``save_pretrained`` to ``WORK/hf/FAMILY``, read back through ``hf:WORK/hf/FAMILY``
exactly as a downloaded model is; no processor is saved, so each normalises with its library's processor
defaults. The torchvision models are the real architectures at their full size (``torchvision:ARCH``, moquad's
seed-0 random init), run at the report's 16 x 64 clip rather than their native one. A moquad checkpoint at random
init is its backbone's torchvision row (the same network), so it has no row of its own.

    OMP_NUM_THREADS=1 nice -n 10 python experiments/encoder_motion.py --work runs/encoder_motion
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from moquad.record import Record, add_argument

FRAMES, SIZE = 16, 64
VIT = dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768)  # ViT-Ti width, 4 deep
# family -> (transformers config class, its settings at the small size), each at a 16-frame 64 px clip
SMALL = {
    "vjepa2": ("VJEPA2Config", dict(patch_size=16, crop_size=SIZE, frames_per_clip=FRAMES, tubelet_size=2,
                                    hidden_size=192, num_hidden_layers=4, num_attention_heads=3, mlp_ratio=4.0,
                                    pred_hidden_size=96, pred_num_attention_heads=3, pred_num_hidden_layers=1,
                                    num_pooler_layers=1)),
    "videomae": ("VideoMAEConfig", dict(image_size=SIZE, patch_size=16, num_frames=FRAMES, tubelet_size=2, **VIT)),
    "timesformer": ("TimesformerConfig", dict(image_size=SIZE, patch_size=16, num_frames=FRAMES, **VIT)),
    "vivit": ("VivitConfig", dict(image_size=SIZE, num_frames=FRAMES, tubelet_size=[2, 16, 16], **VIT)),
    "xclip": ("XCLIPVisionConfig", dict(image_size=SIZE, patch_size=16, num_frames=FRAMES, **VIT)),
}
MODELS = {"VJEPA2Config": "VJEPA2Model", "VideoMAEConfig": "VideoMAEModel", "TimesformerConfig": "TimesformerModel",
          "VivitConfig": "VivitModel", "XCLIPVisionConfig": "XCLIPVisionModel"}
TORCHVISION = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v2_s", "swin3d_t")
COLUMNS = (  # (column, value of one encoder's report, scale, digits); the page's column fits 6
    ("arrow of time top-1 %", lambda r: r["arrow_of_time_top1"], 100, 1),
    ("reversed / crop", lambda r: r["ratio_to_crop"]["reversed"], 1, 2),
    ("speed top-1 %", lambda r: r["speed_top1"], 100, 1),
    ("4x / crop", lambda r: r["ratio_to_crop"]["speed4"], 1, 2),
    ("appearance share", lambda r: r["appearance_share"], 1, 2),
)


# the real clips continuous integration keeps beside the checkout (../shared/data/real-videos of the first folder
# above this file that has it; a git worktree sits one level deeper), None where they are absent
CI_CLIPS = next((p / "shared" / "data" / "real-videos" for p in Path(__file__).resolve().parents
                 if (p / "shared" / "data" / "real-videos").is_dir()), None)


def shards(source: Path, work: Path) -> Path:
    """The clips of ``source`` preprocessed once into ``work/shards`` (one split, test)."""
    from moquad.config import PreprocessConfig
    from moquad.preprocess.run import preprocess

    out = work / "shards"
    if (out / "manifests" / "test.parquet").is_file():
        return out
    videos = sorted(p for p in source.iterdir() if p.suffix.lower() in (".mp4", ".avi", ".mkv", ".webm", ".mov"))
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "clips.csv", "w", newline="") as f:
        csv.writer(f).writerows([["path", "label", "split"], *([str(v.resolve()), "clip", "test"] for v in videos)])
    preprocess(PreprocessConfig(dataset="folder", root=str(work / "clips.csv"), out=str(out), short_side=96,
                                workers=1), quiet=True, threads=1)
    return out


def hf_folder(family: str, work: Path) -> Path:
    """The small random-init model of ``family`` written with ``save_pretrained`` (seed 0)."""
    import torch
    import transformers

    folder = work / "hf" / family
    if not (folder / "config.json").is_file():
        config_class, settings = SMALL[family]
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**settings)
        getattr(transformers, MODELS[config_class])(config).save_pretrained(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/encoder_motion"), help="shards and model folders")
    ap.add_argument("--source", type=Path, default=CI_CLIPS, help="a folder of real videos of your own (default: "
                    "the real clips the checkout's continuous integration keeps beside it, when present)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_argument(ap, "encoder_motion")
    args = ap.parse_args()
    if args.source is None or not args.source.is_dir():
        ap.error(f"--source {args.source or 'FOLDER'}: give a folder of real videos (at least 2)")
    rec = Record("encoder_motion")
    from moquad.eval.encoders import load_encoder
    from moquad.eval.motion import motion_report

    data = shards(args.source, args.work)
    specs = [f"{f}=hf:{hf_folder(f, args.work)}" for f in SMALL] + [f"torchvision:{a}" for a in TORCHVISION]
    t0 = time.time()
    encoders = [load_encoder(s) for s in specs]
    result = motion_report(data, encoders, split="test", frames=FRAMES, size=SIZE, dilation=1, show=False,
                           threads=args.threads)
    print(f"{len(encoders)} encoders on {result['data']['videos']} videos in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for e in encoders:
        r = result["encoders"][e.label]
        name = f"{e.family.description} (hf, small)" if e.label in SMALL else f"`{e.label}` (torchvision)"
        rows.append([name, *(f"{scale * fn(r):.{digits}f}" for _, fn, scale, digits in COLUMNS)])
    rec.figures["protocol"] = result["protocol"]
    rec.figures["data"] = {k: v for k, v in result["data"].items() if k != "dir"}
    rec.figures["encoders"] = {label: {k: v for k, v in r.items() if k != "encoder"} | {
        "encoder": {k: r["encoder"][k] for k in ("spec", "family", "pooling", "clip", "framing", "normalize")}}
        for label, r in result["encoders"].items()}
    rec.figures["seconds_report"] = round(time.time() - t0, 1)
    rec.table("random_init", ["encoder", *(c for c, *_ in COLUMNS)], rows,
              title=f"The motion report of each family at RANDOM INITIALISATION ({result['data']['videos']} real "
                    f"videos, one {FRAMES}-frame {SIZE} px clip each, dilation 1)",
              notes=["Random initialisation (seed 0) is what this table shows: no trained weights. The Hugging Face "
                     "families (hf, small) are their own transformers classes at reduced width and depth (hidden "
                     "size 192, 4 layers, 3 heads, patch 16, X-CLIP: its vision tower); the torchvision models are "
                     f"the real architectures at full size. All at one {FRAMES} x {SIZE} clip, not their native one, "
                     "each framed as its authors frame it (V-JEPA 2, ViViT and torchvision's weights resize the "
                     "short side to 73 px before the 64 px crop). "
                     "Chance: arrow of time 50 %, speed 33 %; ratios: 1 = as different as another crop of the same "
                     "frames; appearance share 1 = the feature is what one frame shows."])
    rec.write(args.record)


if __name__ == "__main__":
    main()
