"""Record (``python tests/golden/record_methods.py``) or check the golden runs of the shipped methods: each method
trains 4 steps through the real loader on a tiny coded dataset (epoch 0: the appearance warm-up where the method
has one, epoch 1: its views), CPU, deterministic. ``tests/test_methods_golden.py`` asserts the renovated code gives
these exact numbers: the losses of every step and a SHA-256 of every parameter and buffer."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).with_name("methods.json")
METHODS = ("moquad", "simclr", "simclr_classic")


def run(method: str, root: Path, data: Path) -> dict:
    import torch

    from moquad.config import LoaderConfig, PretrainConfig
    from moquad.train import loop
    from moquad.train.checkpoint import load
    from moquad.train.log import read_log

    torch.set_num_threads(1)
    cfg = PretrainConfig(data=str(data), out=str(root / method), method=method, backbone="tiny", proj_dim=16,
                         proj_hidden=32, epochs=2, batch_size=4, lr_warmup_epochs=0.5, warmup_ratio=0.5,
                         hard_beta=0.1, ckpt_every=100, log_every=1, device="cpu",
                         loader=LoaderConfig(frames=4, size=16, dilations=(1, 2), workers=0, rad_k=2))
    path = loop.pretrain(cfg, tensorboard=False, progress=False)
    state = load(path)["model"]
    digest = hashlib.sha256()
    for k in sorted(state):
        digest.update(k.encode())
        digest.update(state[k].contiguous().numpy().tobytes())
    recs = read_log(root / method / "log.jsonl")
    return {"loss": [r["loss"] for r in recs], "mode": [r["mode"] for r in recs], "params": digest.hexdigest()}


def record_all(methods=METHODS) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fixtures import coded_dataset

    with tempfile.TemporaryDirectory() as tmp:
        data = coded_dataset(Path(tmp) / "data", num_videos=8, num_frames=24)
        return {m: run(m, Path(tmp), data) for m in methods}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record_all(), indent=1) + "\n")
    print(GOLDEN.read_text())
