"""Can a backbone read playback speed at all? A supervised probe behind the Fig. 4 diagnostic.

MoQuad's Intra-Negs differ from the anchor only in playback speed (dilation). If a network
cannot learn to tell dilations apart even WITH labels, speed negatives cannot teach it
motion either. This trains the backbone + a linear head to predict each clip's dilation
(from the loader's own clips, augmentation included, RAD off) and prints held-out accuracy.

    python experiments/speed_probe.py DATA --frames 8 --size 48 --width 32 --epochs 30

The held-out accuracies go to ``docs/results/speed_probe.json`` (``--record``).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

from moquad import config as C
from moquad.data.augment import normalize
from moquad.data.pipeline import make_loader
from moquad.models.nets import TinyNet
from moquad.record import Record, add_argument


def dilation_labels(batch: dict, classes: dict[int, int]) -> torch.Tensor:
    """Per clip, the index of its dilation (the median positive frame step; loops wrap)."""
    labels = []
    for info in batch["info"]:
        for idx in info["indices"]:
            steps = np.diff(idx)
            labels.append(classes[int(np.median(steps[steps > 0]))])
    return torch.tensor(labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--width", type=int, default=32, help="TinyNet width")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    add_argument(ap, "speed_probe")
    args = ap.parse_args()
    rec = Record("speed_probe")
    rows = []
    torch.manual_seed(0)
    cfg = C.update(C.LoaderConfig(), dict(frames=args.frames, size=args.size, workers=1,
                                          color_jitter=0.0, grayscale=0.0, crop_scale=(0.6, 1.0),
                                          appearance_op="none"))
    classes = {d: i for i, d in enumerate(cfg.dilations)}
    net = TinyNet(width=args.width)
    model = nn.Sequential(net, nn.Linear(net.out_dim, len(classes)))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    print(f"dilations {cfg.dilations}: chance {1 / len(classes):.2f}")
    for epoch in range(args.epochs):
        for b in make_loader(args.data, cfg, split="train", batch_size=args.batch, epoch=epoch, num_batches=4):
            loss = nn.functional.cross_entropy(model(normalize(b["views"], "cpu").flatten(0, 1)),
                                               dilation_labels(b, classes))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            model.eval()
            with torch.no_grad():
                accs = [(model(normalize(b["views"], "cpu").flatten(0, 1)).argmax(1) == dilation_labels(b, classes))
                        .float().mean().item()
                        for b in make_loader(args.data, cfg, split="test", batch_size=args.batch, epoch=999,
                                             num_batches=2)]
            model.train()
            print(f"epoch {epoch + 1:3d}  train loss {loss.item():.3f}  held-out dilation accuracy {np.mean(accs):.3f}")
            rows.append([epoch + 1, f"{loss.item():.3f}", f"{np.mean(accs):.3f}"])
    rec.figures.update(dilations=list(cfg.dilations), chance=1 / len(classes))
    rec.table("accuracy", ["epoch", "train loss", "held-out dilation accuracy"], rows, show=False,
              title=f"A supervised probe of the playback speed, dilations {tuple(cfg.dilations)}")
    rec.write(args.record)


if __name__ == "__main__":
    main()
