"""Elastic resume: a run stopped at step k on N ranks x W workers, resumed by ``pretrain --resume`` on M ranks x V
workers with the same global batch, trains on exactly the global batches of an uninterrupted run (the epoch
permutation sliced by the GLOBAL batch: the reference here is that formula, computed independently).
A changed global batch is refused with one error."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch.multiprocessing as mp
from s3server import free_port
from video_fixtures import coded_video, write_frames

from moquad.config import LoaderConfig
from moquad.errors import MoquadError

VIDEOS, GLOBAL, EPOCHS, SEED = 24, 4, 2, 7
SPE = VIDEOS // GLOBAL  # 6 steps per epoch, 12 in the run


class Stop(Exception):
    """Raised by every rank at the same step: the job 'dies' there (its last checkpoint is that step)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    return str(write_frames(root, ((f"v{i:02d}", coded_video(i, 6), i % 3) for i in range(VIDEOS)),
                            classes=["a", "b", "c"], videos_per_shard=5))


def _cfg(data: str, out: str, workers: int, resume: bool, batch: int = GLOBAL, method: str = "moquad"):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_loop import make_cfg

    return make_cfg(out, data=data, steps_per_epoch=None, epochs=EPOCHS, batch_size=batch, warmup_ratio=0.5,
                    ckpt_every=1, log_every=1, resume=resume, seed=SEED, method=method, queue_size=64,
                    key_bn_group=2, loader=LoaderConfig(frames=4, size=32, workers=workers, seed=SEED))


def _rank(rank: int, world: int, port: int, data: str, out: str, workers: int, resume: bool, stop_at: int,
          method: str = "moquad") -> None:
    """One rank of ``pretrain``; the trainer's loader is the real one, recorded batch by batch (step, manifest rows)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    from test_loop import train

    from moquad.data.pipeline import make_loader

    seen = []

    def recorded(*a, **k):
        for i, batch in enumerate(make_loader(*a, **k)):
            step = k["epoch"] * SPE + k["start"] + i
            if step == stop_at:
                raise Stop
            seen.append([step, batch["index"].tolist()])
            yield batch

    try:
        train(_cfg(data, out, workers, resume, method=method), recorded, tensorboard=False, progress=False)
    except Stop:
        pass
    with open(os.path.join(out, f"seen-{rank}-{'resumed' if resume else 'first'}.json"), "w") as f:
        json.dump(seen, f)


def _run(data: str, out: str, ranks: int, workers: int, resume: bool, stop_at: int = -1,
         method: str = "moquad") -> dict[int, list[int]]:
    """Run ``pretrain`` on ``ranks`` gloo processes; the global batch of every step it trained on."""
    mp.spawn(_rank, args=(ranks, free_port(), data, out, workers, resume, stop_at, method), nprocs=ranks, join=True)
    steps: dict[int, list[int]] = {}
    for rank in range(ranks):  # a global batch is the ranks' parts in rank order
        with open(os.path.join(out, f"seen-{rank}-{'resumed' if resume else 'first'}.json")) as f:
            for step, rows in json.load(f):
                steps.setdefault(step, [None] * ranks)[rank] = rows
    return {s: [i for part in parts for i in part] for s, parts in sorted(steps.items())}


def _reference() -> dict[int, list[int]]:
    """Global batch j of epoch e = slice j of the seeded permutation of the split (the documented epoch plan)."""
    out = {}
    for e in range(EPOCHS):
        order = np.random.default_rng([0x5045524D, SEED, e]).permutation(VIDEOS)
        for j in range(SPE):
            out[e * SPE + j] = order[j * GLOBAL : (j + 1) * GLOBAL].tolist()
    return out


@pytest.mark.parametrize("before,after,stop_at", [((2, 0), (1, 0), 4), ((1, 0), (2, 1), 8), ((2, 2), (2, 0), 7)],
                         ids=["2->1 ranks", "1->2 ranks", "workers 2->0"])
def test_resume_on_other_ranks_and_workers_continues_the_same_global_batches(tmp_path, data, before, after, stop_at):
    """Stopped at ``stop_at`` (mid-epoch), resumed on another layout: the stitched run is the uninterrupted one,
    every video once per epoch (none twice, none skipped), and the run ends at its last step."""
    from moquad.train.checkpoint import load

    out = str(tmp_path / "run")
    first = _run(data, out, *before, resume=False, stop_at=stop_at)
    assert sorted(first) == list(range(stop_at)) and load(os.path.join(out, "checkpoints", "last.pt"))["step"] == stop_at
    rest = _run(data, out, *after, resume=True)
    assert sorted(rest) == list(range(stop_at, EPOCHS * SPE))
    assert {**first, **rest} == _reference()
    for e in range(EPOCHS):
        used = [i for s in range(e * SPE, (e + 1) * SPE) for i in {**first, **rest}[s]]
        assert sorted(used) == list(range(VIDEOS))
    assert load(os.path.join(out, "checkpoints", "last.pt"))["step"] == EPOCHS * SPE


def test_a_momentum_run_resumes_on_other_ranks_with_its_queue(tmp_path, data):
    """moco_moquad stopped mid-epoch on 2 ranks and resumed on 1: the same global batches as the reference, and the
    queue (64 slots, more than the run's 48 keys) holds the video of every key of the stitched run in global-batch
    order: the resumed rank continued the stopped run's queue and pointer (a fresh queue would have lost the first
    4 steps' keys), and the 2-rank part filled it with the GLOBAL batch in rank order, as 1 rank does."""
    import torch

    from moquad.train.checkpoint import load

    out = str(tmp_path / "run")
    first = _run(data, out, 2, 0, resume=False, stop_at=4, method="moco_moquad")
    stopped = load(os.path.join(out, "checkpoints", "last.pt"))["momentum"]
    rest = _run(data, out, 1, 0, resume=True, method="moco_moquad")
    assert {**first, **rest} == _reference()
    mom = load(os.path.join(out, "checkpoints", "last.pt"))["momentum"]
    keys = [i for s in range(EPOCHS * SPE) for i in _reference()[s]]
    assert mom["queue_video"].tolist() == keys + [-1] * (64 - len(keys))
    assert int(mom["ptr"]) == len(keys) == 48 and int(stopped["ptr"]) == 16
    torch.testing.assert_close(mom["queue"][:16], stopped["queue"][:16])  # the stopped run's keys, kept
    assert (mom["queue"][16:48] != stopped["queue"][16:48]).any(dim=1).all()  # and the resumed steps' keys after them


def test_a_changed_global_batch_is_refused(tmp_path, data):
    """The epoch plan is a function of the global batch: resuming with another one is one MoquadError that names both
    and the way out (the ranks may change, the global batch may not)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_loop import train

    out = str(tmp_path / "run")
    cfg = _cfg(data, out, workers=0, resume=False)
    train(cfg.__class__(**{**cfg.__dict__, "epochs": 1}), tensorboard=False, progress=False)
    changed = _cfg(data, out, workers=0, resume=True, batch=2 * GLOBAL)
    with pytest.raises(MoquadError, match=rf"global batch {GLOBAL}.*now {2 * GLOBAL}.*batch_size={GLOBAL}"):
        train(changed.__class__(**{**changed.__dict__, "epochs": 1}), tensorboard=False, progress=False)
