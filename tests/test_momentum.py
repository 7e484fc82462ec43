"""The momentum-encoder slot (moquad.train.momentum) and the methods on it (moco, moco_moquad): the loss against a
direct float64 per-element formula, the EMA schedule and queue, exact resume after a signal mid-epoch (in the
library and from the CLI), and a real 2-process gloo group (the queue takes the global batch's keys)."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from s3server import free_port
from test_loop import fake_loader, make_cfg, train
from torch import nn

from moquad.config import KEY_BN, PretrainConfig
from moquad.errors import MoquadError
from moquad.models import build_model
from moquad.train import preempt
from moquad.train.checkpoint import load
from moquad.train.log import read_log
from moquad.train.loop import _keys, _project
from moquad.train.losses import momentum_loss
from moquad.train.methods import METHODS
from moquad.train.momentum import MomentumEncoder

REPO = Path(__file__).resolve().parent.parent
KEY_ROLES = ("positive", "intra_negative", "intra_negative")


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def _unit(v):
    n = math.sqrt(sum(float(x) ** 2 for x in v))
    return [float(x) / n for x in v]


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def ref_momentum(q, keys, roles, queue, queue_video, videos, tau, beta, alpha):
    """The loss written out in float64 Python, one anchor and one candidate at a time."""
    b, w = keys.shape[:2]
    pos = roles.index("positive")
    intra = [i for i, r in enumerate(roles) if r == "intra_negative"]
    total = 0.0
    for i in range(b):
        a = _unit(q[i])
        s_pos = _dot(a, _unit(keys[i, pos]))
        s_intra = [_dot(a, _unit(keys[i, k])) for k in intra]
        inter = [_dot(a, _unit(keys[j, s])) for j in range(b) if videos[j] != videos[i] for s in range(w)]
        inter += [_dot(a, _unit(queue[k])) for k in range(len(queue)) if queue_video[k] >= 0
                  and queue_video[k] != videos[i]]
        k = min(len(inter), max(1, math.floor(beta * len(inter)))) if beta > 0 else 0  # Eq. 4 over ITS negatives
        hard = set(sorted(range(len(inter)), key=lambda n: -inter[n])[:k])
        wi = alpha if k else 1.0
        den = math.exp(s_pos / tau) + sum(wi * math.exp(s / tau) for s in s_intra)
        den += sum((alpha if n in hard else 1.0) * math.exp(s / tau) for n, s in enumerate(inter))
        total += -math.log(math.exp(s_pos / tau) / den)
    return total / b


@pytest.mark.parametrize("roles, beta, alpha", [(KEY_ROLES[:1], 0.0, 1.0), (KEY_ROLES, 0.0, 1.0),
                                                (KEY_ROLES, 0.05, 1.5), (KEY_ROLES[:2], 0.3, 2.0)])
def test_momentum_loss_matches_the_per_element_formula(roles, beta, alpha):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(5, len(roles), 8, generator=g, dtype=torch.float64)
    queue = torch.randn(7, 8, generator=g, dtype=torch.float64)
    queue_video = torch.tensor([3, -1, 10, 11, 0, -1, 12])  # two empty slots, two keys of this batch's videos
    videos = torch.tensor([0, 1, 1, 3, 4])  # video 1 twice: never its own negative
    got = momentum_loss(q.float(), keys.float(), roles, queue=queue.float(), queue_video=queue_video, tau=0.2,
                        hard_beta=beta, hard_alpha=alpha, video=videos)[0]
    want = ref_momentum(q, keys, roles, queue, queue_video.tolist(), videos.tolist(), 0.2, beta, alpha)
    assert float(got) == pytest.approx(want, rel=1e-5)


def eq4_reference(q, pos, negatives, tau, beta, alpha):
    """Eq. 4 of the paper for ONE anchor, from the list of the negatives that exist for it (no masks): the top
    K = beta x len(negatives) of them by similarity (floored, at least one: the product's convention) weighted
    alpha, the others 1; float64 Python."""
    a = _unit(q)
    s_pos = _dot(a, _unit(pos))
    sims = sorted((_dot(a, _unit(n)) for n in negatives), reverse=True)
    k = max(1, math.floor(beta * len(sims))) if beta > 0 and sims else 0
    den = math.exp(s_pos / tau) + sum((alpha if r < k else 1.0) * math.exp(s / tau) for r, s in enumerate(sims))
    return -math.log(math.exp(s_pos / tau) / den)


@pytest.mark.parametrize("filled", [0, 3, 10])
def test_eq4_counts_each_anchors_unmasked_negatives(filled):
    """Eq. 4's K counts only the negatives an anchor has: its batch's other videos' keys and the queue's FILLED
    slots of other videos, on an empty, a partly filled and a full queue (the queue's empty slots and a key of the
    anchor's own video are no negatives)."""
    g = torch.Generator().manual_seed(7)
    b, size = 4, 10
    q = torch.randn(b, 8, generator=g, dtype=torch.float64)
    keys = torch.randn(b, 1, 8, generator=g, dtype=torch.float64)
    queue = torch.randn(size, 8, generator=g, dtype=torch.float64)
    videos = [0, 1, 2, 3]
    queue_video = [-1] * size
    for slot in range(filled):
        queue_video[slot] = [20, 1, 1, 1, 23, 24, 2, 25, 26, 27][slot]  # videos 1, 2: own keys of anchors 1, 2
    got = momentum_loss(q.float(), keys.float(), ("positive",), queue=queue.float(),
                        queue_video=torch.tensor(queue_video), tau=0.2, hard_beta=0.25, hard_alpha=3.0,
                        video=torch.tensor(videos))[0]
    want = 0.0
    for i in range(b):
        negatives = [keys[j, 0] for j in range(b) if j != i]
        negatives += [queue[k] for k in range(size) if queue_video[k] >= 0 and queue_video[k] != videos[i]]
        want += eq4_reference(q[i], keys[i, 0], negatives, 0.2, 0.25, 3.0) / b
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_a_queue_without_video_ids_is_an_error_naming_the_fix(tmp_path):
    """Without ``batch["index"]`` the queue could not mask a video's own keys; it is an error that says what to do,
    in the loss and in a run (a loader without manifest indices), never a queue that silently does nothing."""
    g = torch.Generator().manual_seed(8)
    q, keys, queue = torch.randn(3, 8, generator=g), torch.randn(3, 1, 8, generator=g), torch.randn(5, 8, generator=g)
    with pytest.raises(ValueError, match=r"batch\['index'\].*queue_size=0"):
        momentum_loss(q, keys, ("positive",), queue=queue, queue_video=torch.tensor([0, 1, -1, -1, -1]), tau=0.2)
    with pytest.raises(ValueError, match=r"batch\['index'\].*queue_size=0"):
        train(_cfg(tmp_path / "run", method="moco", epochs=1), fake_loader, tensorboard=False, progress=False)
    train(_cfg(tmp_path / "none", method="moco", epochs=1, queue_size=0), fake_loader, tensorboard=False,
          progress=False)  # no queue: no ids needed
    assert len(read_log(tmp_path / "none" / "log.jsonl")) == 4


def test_global_keys_slice_equals_the_whole_batch():
    g = torch.Generator().manual_seed(4)
    q, keys = torch.randn(4, 8, generator=g), torch.randn(4, 3, 8, generator=g)
    whole = momentum_loss(q, keys, KEY_ROLES, tau=0.1, hard_beta=0.1, hard_alpha=1.5)[0]
    parts = [momentum_loss(q[r * 2:r * 2 + 2], keys[r * 2:r * 2 + 2], KEY_ROLES, keys_global=keys, offset=2 * r,
                           tau=0.1, hard_beta=0.1, hard_alpha=1.5)[0] for r in range(2)]
    assert float(whole) == pytest.approx(float(sum(parts) / 2), rel=1e-6)


def test_ema_schedule_and_queue():
    model = torch.nn.Linear(2, 2)
    m = MomentumEncoder(model, 0.99, 5, 2)
    assert m.momentum(0, 100) == pytest.approx(0.99) and m.momentum(50, 100) == pytest.approx(0.995)
    assert m.momentum(100, 100) == 1.0
    before = [p.clone() for p in m.encoder.parameters()]
    with torch.no_grad():
        model.weight.add_(1.0)
    m.update(model, 0, 100)
    assert torch.allclose(m.encoder.weight, before[0] * 0.99 + model.weight * 0.01)
    assert not m.encoder.weight.requires_grad
    m.enqueue(torch.ones(3, 2), torch.tensor([1, 2, 3]))
    m.enqueue(2 * torch.ones(3, 2), torch.tensor([4, 5, 6]))  # wraps: slots 3, 4, 0
    assert m.ptr == 1 and m.queue_video.tolist() == [6, 2, 3, 4, 5] and m.queue[0].tolist() == [2.0, 2.0]
    state = m.state_dict()
    other = MomentumEncoder(torch.nn.Linear(2, 2), 0.99, 5, 2)
    other.load_state_dict(state)
    assert other.ptr == 1 and torch.equal(other.queue, m.queue) and torch.equal(other.encoder.weight, m.encoder.weight)


def _video_loader(*a, **kw):
    """fake_loader with manifest indices (the queue stores each key's video)."""
    for i, batch in enumerate(fake_loader(*a, **kw)):
        n = len(batch["video_id"])
        yield {**batch, "index": torch.arange(n) + n * ((kw["start"] + i) % 3)}


def _cfg(out, **kw):
    return make_cfg(out, **{"method": "moco_moquad", "queue_size": 12, "momentum": 0.9, **kw})


def _stop_at(at: int):
    """_video_loader that sends SIGTERM to this process while it hands out global step ``at`` (0-based)."""

    def loader(*a, **kw):
        for i, batch in enumerate(_video_loader(*a, **kw)):
            if kw["epoch"] * 4 + kw["start"] + i == at:
                os.kill(os.getpid(), signal.SIGTERM)
            yield batch

    return loader


@pytest.mark.parametrize("method, extra", [("moco", {}), ("moco_moquad", {}),
                                           ("moco_moquad", {"key_bn": "split", "key_bn_group": 2})],
                         ids=["moco", "moco_moquad", "moco_moquad-split"])
def test_signal_mid_epoch_then_resume_is_bit_identical(tmp_path, method, extra):
    """EMA weights, queue and pointer are in the checkpoint: a run stopped mid-epoch continues exactly (with the
    SplitBatchNorm of ``key_bn=split`` too: its running statistics are the network's)."""
    full, part = tmp_path / "full", tmp_path / "part"
    train(_cfg(full, method=method, **extra), _video_loader, tensorboard=False, progress=False)
    with pytest.raises(preempt.Preempted):
        train(_cfg(part, method=method, **extra), _stop_at(5), tensorboard=False, progress=False)
    assert load(part / "checkpoints" / "last.pt")["step"] == 6  # mid-epoch 1
    train(_cfg(part, method=method, resume=True, **extra), _video_loader, tensorboard=False, progress=False)
    a, b = read_log(full / "log.jsonl"), read_log(part / "log.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(b) == 12
    sa, sb = load(full / "checkpoints" / "last.pt"), load(part / "checkpoints" / "last.pt")
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    ma, mb = sa["momentum"], sb["momentum"]
    for k in ma["encoder"]:
        assert torch.equal(ma["encoder"][k], mb["encoder"][k]), k
    assert torch.equal(ma["queue"], mb["queue"]) and torch.equal(ma["queue_video"], mb["queue_video"])
    assert int(ma["ptr"]) == int(mb["ptr"]) == (12 * 4) % 12 and (ma["queue_video"] >= 0).all()
    assert [r["mode"] for r in a][:4] == (["appearance"] * 4 if method == "moco_moquad" else ["moco"] * 4)


def test_a_checkpoint_without_the_momentum_encoder_is_refused(tmp_path):
    from moquad.errors import MoquadError

    out = tmp_path / "run"
    train(make_cfg(out, epochs=1, warmup_ratio=0.0), fake_loader, tensorboard=False, progress=False)
    ckpt = load(out / "checkpoints" / "last.pt")
    ckpt["config"]["method"] = "moco"
    torch.save(ckpt, out / "checkpoints" / "last.pt")
    with pytest.raises(MoquadError, match="holds none"):
        train(make_cfg(out, epochs=1, warmup_ratio=0.0, method="moco", resume=True), _video_loader,
              tensorboard=False, progress=False)


# ----------------------------------------------------------------------------- a real 2-process gloo group


def _dist_worker(rank: int, world: int, port: int, out_dir: str, key_bn: str, symmetric: bool) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from moquad import dist

    dist.init("cpu")
    try:
        torch.save(_momentum_steps(rank, world, key_bn, symmetric), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.cleanup()


def _momentum_steps(rank: int, world: int, key_bn: str = "eval", symmetric: bool = False) -> dict:
    """Two steps of moco_moquad's loss through forward_loss: loss, gradients, queue. The online network in eval mode
    (a split batch sees the same function); the keys' BatchNorm: ``eval`` (the copy in eval mode), or a mode of
    ``moquad.config.KEY_BN`` in train mode (``groups``: of 2 videos, so each rank of 2 encodes one group)."""
    from moquad.models import build_model
    from moquad.train.loop import forward_loss
    from moquad.train.methods import Momentum
    from moquad.train.momentum import MomentumEncoder

    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=8, proj_hidden=16).eval()
    mom = MomentumEncoder(model, 0.9, 6, 8, key_bn="batch" if key_bn == "eval" else key_bn,
                          group=2 if key_bn == "groups" else 0, routing=Momentum().with_symmetric(symmetric))
    if key_bn == "eval":
        mom.encoder.eval()
    g = torch.Generator().manual_seed(1)
    out: dict = {"loss": [], "grad": []}
    per = 4 // world
    for step in range(2):
        views = torch.randn(4, 4, 3, 4, 16, 16, generator=g)[rank * per:(rank + 1) * per]
        video = (torch.arange(4) + 4 * step)[rank * per:(rank + 1) * per]
        model.zero_grad()
        mom.update(model, step, 10)
        loss, _ = forward_loss(model, views, ("anchor", *KEY_ROLES), "moquad.train.losses:momentum_contrast",
                               tau=0.1, hard_beta=0.2, hard_alpha=1.5, video=video, momentum=mom)
        loss.backward()
        from moquad import dist

        out["loss"].append(float(dist.all_reduce(loss.detach(), "mean")))
        out["grad"].append([dist.all_reduce(p.grad, "mean") for p in model.parameters()])
    out.update(queue=mom.queue.clone(), queue_video=mom.queue_video.clone(), ptr=mom.ptr)
    return out


@pytest.mark.parametrize("key_bn, symmetric", [("eval", False), ("groups", False), ("running", True)])
def test_two_ranks_fill_the_queue_with_the_global_batch(tmp_path, key_bn, symmetric):
    """The keys' BatchNorm modes and the symmetric routing do not make a run depend on the number of ranks: 2 ranks
    give the losses, gradients and queue of 1 (``groups``: each group's statistics apart, wherever it is encoded;
    ``running``: no batch statistics)."""
    ref = _momentum_steps(0, 1, key_bn, symmetric)
    mp.spawn(_dist_worker, args=(2, free_port(), str(tmp_path), key_bn, symmetric), nprocs=2, join=True)
    # the queue holds the second step's positive keys (and, symmetric, its anchor keys: two per video) and the
    # first step's that are not overwritten yet
    want = [6, 7, 2, 3, 4, 5] if not symmetric else [5, 5, 6, 6, 7, 7]
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
        for a, b in zip(got["grad"][1], ref["grad"][1]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        assert got["queue_video"].tolist() == ref["queue_video"].tolist() == want
        torch.testing.assert_close(got["queue"], ref["queue"], atol=1e-5, rtol=1e-5)
        assert got["ptr"] == ref["ptr"] == (0 if symmetric else 2)  # 8 keys into 6 slots: the last 6 of them


# ----------------------------------------------------------------------------- the CLI


def test_cli_moco_moquad_resumes_exactly_after_sigterm(tmp_path):
    from video_fixtures import coded_dataset

    data = coded_dataset(tmp_path / "data", num_videos=8, num_frames=24, videos_per_shard=4)
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
           "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}

    def pretrain(out: Path, *extra: str) -> subprocess.Popen:
        args = [sys.executable, "-m", "moquad.cli", "pretrain", "--method", "moco_moquad", "--data", str(data),
                "--out", str(out), "--backbone", "tiny", "--batch-size", "2", "--frames", "4", "--size", "16",
                "--workers", "0", "--device", "cpu", "--epochs", "3", "--warmup-ratio", "0.34", "--set",
                "proj_hidden=16", "--set", "queue_size=6", "--set", "key_bn_group=2", "--set", "loader.dilations=1,2",
                *extra]
        return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    full = pretrain(tmp_path / "full")
    assert full.wait(timeout=300) == 0, full.stderr.read()
    part = pretrain(tmp_path / "part")
    log = tmp_path / "part" / "log.jsonl"
    for _ in range(3000):  # SIGTERM once the run is in its second epoch
        if log.is_file() and len(log.read_text().splitlines()) >= 5 or part.poll() is not None:
            break
        import time

        time.sleep(0.02)
    part.send_signal(signal.SIGTERM)
    assert part.wait(timeout=300) == 75, part.stderr.read()
    stopped = load(tmp_path / "part" / "checkpoints" / "last.pt")["step"]
    assert 5 <= stopped < 12
    resumed = pretrain(tmp_path / "part", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    a, b = read_log(tmp_path / "full" / "log.jsonl"), read_log(log)
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and [r["step"] for r in b] == list(range(1, 13))
    sa, sb = load(tmp_path / "full" / "checkpoints" / "last.pt"), load(tmp_path / "part" / "checkpoints" / "last.pt")
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    assert torch.equal(sa["momentum"]["queue"], sb["momentum"]["queue"])


def test_key_bn_groups_must_divide_the_per_rank_batch(tmp_path):
    """Groups of keys that do not divide a rank's batch would be cut differently on another number of ranks: one
    error at start-up that names the setting."""
    from moquad.errors import MoquadError

    with pytest.raises(MoquadError, match=r"key_bn_group.*per-rank batch of 4"):
        train(_cfg(tmp_path / "run", method="moco", key_bn="groups", key_bn_group=3), _video_loader, tensorboard=False, progress=False)


def test_a_queue_as_large_as_the_split_gets_a_line():
    from moquad.train.loop import queue_advice

    assert queue_advice(128, 280) is None
    assert queue_advice(4096, 280) == ("the queue of 4096 keys is at least as large as the 280 training videos: it "
                                       "holds several, mostly stale keys of every video; use queue_size=128 "
                                       "(about half the split) or fewer")
    assert "queue_size=4 " in queue_advice(8, 8)


def test_the_start_up_line_says_what_the_momentum_encoder_is():
    """The row's choices and the settings over them, as the run will train them; a group of 1 video (BatchNorm over
    one sample) is refused by the config."""
    from moquad.config import PretrainConfig
    from moquad.models import build_model
    from moquad.train.methods import METHODS
    from moquad.train.momentum import build, describe

    cfg = PretrainConfig(backbone="tiny", proj_dim=8, proj_hidden=16, queue_size=128)
    model = build_model("tiny", 8, 16)
    line = describe(build(METHODS["moco_moquad"].configured(cfg).momentum, model, cfg), 16)
    assert line.startswith("pretrain: momentum encoder: EMA from m0 0.99, an MLP predictor, keys' BatchNorm in groups "
                           "of 4 videos (queries over the batch), a queue of 128 keys (")
    cfg = dataclasses.replace(cfg, predictor=False, key_bn="batch", queue_size=0)
    line = describe(build(METHODS["moco"].configured(cfg).momentum, model, cfg), 16)
    assert "no predictor, keys' BatchNorm over the batch, no queue" in line
    with pytest.raises(ValueError, match="key_bn_group"):
        PretrainConfig(key_bn_group=1)


def test_groups_as_large_as_the_batch_are_named_the_whole_batch(tmp_path, capsys):
    """Groups of 4 in a per-rank batch of 4 encode the keys exactly as ``key_bn=batch`` does; the start-up line of
    the run says so, with the setting that splits the batch."""
    torch.manual_seed(0)
    model = build_model("tiny", 8, 16)
    views = torch.randn(4, 2, 3, 4, 16, 16)
    grouped, whole = (MomentumEncoder(model, 0.9, 0, 8, key_bn=k, group=g) for k, g in (("groups", 4), ("batch", 0)))
    assert torch.equal(_keys(grouped, views), _keys(whole, views))
    train(_cfg(tmp_path / "run", method="moco", key_bn="groups", steps_per_epoch=1, epochs=1), _video_loader,
          tensorboard=False, progress=False)
    out = capsys.readouterr().out
    assert "keys' BatchNorm over the batch (groups of 4 videos hold the whole per-rank batch of 4; --key-bn-group N " \
           "below it splits it)" in out
    assert "in groups of 4 videos" not in out


def test_the_key_bn_choices_are_the_rows_of_the_table():
    from moquad.train.momentum import KEY_NORMS

    assert tuple(KEY_NORMS) == KEY_BN


def _touched(fn, x: torch.Tensor) -> list[set[int]]:
    """For each row i of ``fn(x)`` (B, ...): the rows j of ``x`` whose change moves row i's output (measured)."""
    base = fn(x)
    out: list[set[int]] = [set() for _ in range(x.shape[0])]
    for j in range(x.shape[0]):
        y = x.clone()
        y[j] = y[j] * 3.0 + 1.0
        moved = (fn(y) - base).flatten(1).abs().amax(1) > 1e-5
        for i in torch.nonzero(moved).flatten().tolist():
            out[i].add(j)
    return out


@pytest.mark.parametrize("key_bn", ["split", "groups"])
def test_split_bn_keeps_each_key_out_of_its_querys_statistics(key_bn):
    """``key_bn=split`` (MoCo's SplitBatchNorm): measured by perturbing one video at a time through the real
    forwards, query i's BatchNorm statistics hold the videos of its group of 4 and key i's hold no other video of
    that group: a query never shares statistics with its own key; with ``groups`` every key group lies inside the
    query's batch."""
    from moquad.train.momentum import build, set_splits

    torch.manual_seed(0)
    cfg = PretrainConfig(backbone="tiny", proj_dim=8, proj_hidden=16, queue_size=0, key_bn_group=4)
    apart, model = key_bn == "split", build_model("tiny", 8, 16)
    mom = build(METHODS["moco"].configured(dataclasses.replace(cfg, key_bn=key_bn, predictor=False)).momentum,
                model, cfg)
    views = torch.randn(16, 2, 3, 4, 16, 16)

    def query(x):
        if apart:
            set_splits(model, 4)
        return _project(model, x[:, :1]).detach()

    queries, keys = _touched(query, views), _touched(lambda x: _keys(mom, x[:, 1:]), views)
    for i in range(16):
        group = set(range(i // 4 * 4, i // 4 * 4 + 4))
        assert queries[i] == (group if apart else set(range(16)))
        assert len(keys[i]) == 4 and i in keys[i]
        assert (keys[i] & queries[i] == {i}) if apart else keys[i] <= queries[i]


def test_split_bn_needs_as_many_groups_as_videos_per_group(tmp_path):
    """Groups of 4 in a per-rank batch of 4 leave no other group to move a key to: one error naming the size."""
    with pytest.raises(MoquadError, match=r"groups of 4 make 1 of the per-rank batch of 4; pass key_bn_group=2$"):
        train(_cfg(tmp_path / "run", method="moco", key_bn="split"), _video_loader, tensorboard=False, progress=False)


def test_split_bn_trains_and_its_running_statistics_are_the_groups_mean():
    """A SplitBatchNorm in training normalises each group with its own mean and variance (the per-group formula)
    and keeps the groups' mean as running statistics; in eval mode it is the network's BatchNorm."""
    from moquad.train.momentum import set_splits, split_batchnorm

    torch.manual_seed(0)
    bn = nn.BatchNorm3d(3)
    x = torch.randn(8, 3, 2, 4, 4, dtype=torch.float64)
    split_batchnorm(bn).double()
    set_splits(bn, 2)
    out = bn(x)
    for g in range(2):
        part = x[g * 4:(g + 1) * 4]
        mean, var = part.mean((0, 2, 3, 4), keepdim=True), part.var((0, 2, 3, 4), unbiased=False, keepdim=True)
        torch.testing.assert_close(out[g * 4:(g + 1) * 4], (part - mean) / torch.sqrt(var + bn.eps))
    unbiased = torch.stack([x[g * 4:(g + 1) * 4].var((0, 2, 3, 4)) for g in range(2)]).mean(0)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * unbiased)
    assert set(bn.state_dict()) == set(nn.BatchNorm3d(3).state_dict())
