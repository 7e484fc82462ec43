"""The golden runs of the shipped methods: each trains 4 steps through the real loader on a tiny coded dataset
(epoch 0: the appearance warm-up where the method has one, epoch 1: its views), CPU, deterministic.
``tests/test_methods_golden.py`` asserts the code gives the recorded numbers: the losses of every step and every
parameter and buffer, bit for bit on a machine and settings a recording was made with (its kernel fingerprint,
``tests/kernel_settings.py``), else within :data:`LOSS_RTOL` / :data:`PARAM_RTOL`.

``python tests/golden_methods/record_methods.py`` adds a recording for this machine's kernels under the AVX2 setting (an
AVX-512 CPU capped to AVX2; an AVX2 CPU as it is), the setting the test runs under; it refuses when the numbers
are not within tolerance of the first recording (the code changed them): ``--new`` then replaces every recording
(the numbers changed on purpose; say why in the commit). ``--print``: print this process's recording, write nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).with_name("methods.json")
METHODS = ("moquad", "simclr", "simclr_classic", "moco", "moco_moquad")
# Tolerances where the kernels differ from a recording's. Measured with `python tests/kernel_settings.py measure` on an AMD
# EPYC with AVX-512 (torch 2.14.1, numpy 2.4.6, opencv 5.0.0): between its default, avx2 and sse41 settings the losses
# differ by at most 2.2e-6 (relative) and a parameter tensor's sum, L1 and L2 norm by at most 5.2e-6 (relative to
# its norm); the tolerances are about 20x the larger of the two.
LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-4


def run(method: str, root: Path, data: Path) -> dict:
    import torch

    from moquad.config import LoaderConfig, PretrainConfig
    from moquad.train import loop
    from moquad.train.checkpoint import load
    from moquad.train.log import read_log

    torch.set_num_threads(1)
    cfg = PretrainConfig(data=str(data), out=str(root / method), method=method, backbone="tiny", proj_dim=16,
                         proj_hidden=32, epochs=2, batch_size=4, lr_warmup_epochs=0.5, warmup_ratio=0.5,
                         hard_beta=0.1, ckpt_every=100, log_every=1, device="cpu", queue_size=8, key_bn_group=2,
                         loader=LoaderConfig(frames=4, size=16, dilations=(1, 2), workers=0, rad_k=2))
    path = loop.pretrain(cfg, tensorboard=False, progress=False)
    state = load(path)["model"]
    digest, stats = hashlib.sha256(), {}
    for k in sorted(state):
        digest.update(k.encode())
        digest.update(state[k].contiguous().numpy().tobytes())
        x = state[k].double()
        stats[k] = [float(x.sum()), float(x.abs().sum()), float(x.norm())]  # sum, L1, L2: compared within tolerance
    recs = read_log(root / method / "log.jsonl")
    return {"loss": [r["loss"] for r in recs], "mode": [r["mode"] for r in recs], "params": digest.hexdigest(),
            "stats": stats}


def record_all(methods=METHODS) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from video_fixtures import coded_dataset

    with tempfile.TemporaryDirectory() as tmp:
        data = coded_dataset(Path(tmp) / "data", num_videos=8, num_frames=24)
        return {m: run(m, Path(tmp), data) for m in methods}


def recording() -> dict:
    """This process's recording: its kernel fingerprint and the runs of every method (run it under the kernel
    variables of the setting it records: :func:`record_in`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernel_settings import fingerprint

    return {"kernels": fingerprint(), "runs": record_all()}


def record_in(env: dict[str, str]) -> dict:
    """:func:`recording` made in a fresh process with environment ``env`` (kernel variables are read at start-up)."""
    out = subprocess.run([sys.executable, __file__, "--print"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def differences(a: dict, b: dict) -> dict:
    """The largest relative difference between the losses and between the parameter statistics of two recordings'
    runs; a tensor's sum and L1 norm are relative to its L1 norm, its L2 norm to itself."""
    loss = max(abs(x - y) / max(abs(x), 1e-12) for m in a for x, y in zip(a[m]["loss"], b[m]["loss"]))
    params = 0.0
    for m in a:
        for k, (s, l1, l2) in a[m]["stats"].items():
            s2, l12, l22 = b[m]["stats"][k]
            params = max(params, abs(s - s2) / max(l1, 1e-12), abs(l1 - l12) / max(l1, 1e-12),
                         abs(l2 - l22) / max(l2, 1e-12))
    exact = all(a[m]["loss"] == b[m]["loss"] and a[m]["params"] == b[m]["params"] for m in a)
    return {"loss": loss, "params": params, "exact": exact}


def add(new: bool, setting: str | None = None) -> None:
    """Add this machine's recording under ``setting`` (default: the golden setting, AVX2) to GOLDEN, replacing one
    of the same fingerprint, or with ``new`` start over."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernel_settings import KERNEL_VARS, SETTINGS, golden_env

    env = golden_env() if setting is None else \
        {**{k: v for k, v in os.environ.items() if k not in KERNEL_VARS}, **SETTINGS[setting]}
    rec = record_in(env)
    old = [] if new or not GOLDEN.is_file() else json.loads(GOLDEN.read_text())["recordings"]
    if old:
        d = differences(old[0]["runs"], rec["runs"])
        if d["loss"] > LOSS_RTOL or d["params"] > PARAM_RTOL or any(
                old[0]["runs"][m]["mode"] != rec["runs"][m]["mode"] for m in METHODS):
            sys.exit(f"refused: these numbers are not those of the first recording ({d}); the code changed them. "
                     "If that is intended, record with --new and say why in the commit")
    keep = [r for r in old if r["kernels"] != rec["kernels"]]
    GOLDEN.write_text(json.dumps({"recordings": [*keep, rec]}, indent=1) + "\n")
    print(f"{GOLDEN}: {len(keep) + 1} recordings")


if __name__ == "__main__":
    if "--print" in sys.argv:
        print(json.dumps(recording()))
    else:  # --setting NAME: another kernel setting of tests/kernel_settings.py (a reference for the tolerance)
        add("--new" in sys.argv, sys.argv[sys.argv.index("--setting") + 1] if "--setting" in sys.argv else None)
