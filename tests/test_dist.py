"""A real 2-process gloo group: gathered projections and DDP gradients equal one process on the
global batch; the training loop under the group."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from s3server import free_port

from moquad import dist

ROLES = ("anchor", "positive", "intra_negative", "intra_negative")


def _model():
    from moquad.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=8, proj_hidden=16)
    return model.eval()  # eval-mode BN: per-sample, so a split batch sees the same function


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 4, 3, 4, 16, 16, generator=g)  # global batch: 4 videos x 4 views


VIDEOS = torch.tensor([0, 1, 1, 2])  # video 1 twice, once on each rank: masked across the gather


def _grads(model, views, out, video):
    from moquad.train.loop import forward_loss

    result = {}
    for mode, v, params in (  # each loss takes its own hyperparameters
        ("quadruple", views, {"tau": 0.1, "hard_beta": 0.2, "hard_alpha": 1.5}),
        ("nt_xent", views[:, :2], {"tau": 0.1}),
        ("speed_pair", views[:, :2], {"tau": 0.1}),
    ):
        model.zero_grad()
        loss, stats = forward_loss(model, v, ROLES[:v.shape[1]], f"moquad.train.losses:{mode}", video=video, **params)
        loss.backward()
        core = model.module if hasattr(model, "module") else model
        result[mode] = [p.grad.clone() for p in core.parameters()]
        result[mode + "_loss"] = dist.all_reduce(loss.detach(), "mean")
    torch.save(result, out)


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    info = dist.init("cpu")
    try:
        assert info.world_size == world and dist.get_rank() == rank
        # gather: forward values in rank order, backward sums every rank's gradient of its slice
        x = torch.full((2, 3), float(rank + 1), requires_grad=True)
        y = dist.gather(x)
        (y * torch.arange(4.0)[:, None]).sum().backward()
        torch.save({"gathered": y.detach(), "xgrad": x.grad}, os.path.join(out_dir, f"gather{rank}.pt"))

        model = torch.nn.parallel.DistributedDataParallel(_model())
        views = _batch()[rank * 2 : (rank + 1) * 2]
        _grads(model, views, os.path.join(out_dir, f"grads{rank}.pt"), VIDEOS[rank * 2 : (rank + 1) * 2])
        dist.barrier()
    finally:
        dist.cleanup()


def test_two_process_gloo_matches_single_process(tmp_path, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)

    for rank in range(2):
        g = torch.load(tmp_path / f"gather{rank}.pt")
        torch.testing.assert_close(g["gathered"], torch.tensor([[1.0] * 3] * 2 + [[2.0] * 3] * 2))
        # d/dx of sum_r sum_i w_i * gathered_i over both ranks: rows of this rank, weights 0..3, times 2 ranks
        want = 2 * torch.arange(4.0)[rank * 2 : (rank + 1) * 2, None].expand(2, 3)
        torch.testing.assert_close(g["xgrad"], want)

    single = tmp_path / "single.pt"
    _grads(_model(), _batch(), single, VIDEOS)
    ref = torch.load(single)
    for rank in range(2):
        got = torch.load(tmp_path / f"grads{rank}.pt")
        for mode in ("quadruple", "nt_xent", "speed_pair"):
            assert float(got[mode + "_loss"]) == pytest.approx(float(ref[mode + "_loss"]), rel=1e-5)
            for a, b in zip(got[mode], ref[mode]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-6)


def _pretrain_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import sys

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    from test_loop import fake_loader, make_cfg, train


    seen = []

    def loader(*a, **kw):
        seen.append((kw["rank"], kw["world_size"], kw["batch_size"], kw["epoch"]))
        return fake_loader(*a, **kw)

    cfg = make_cfg(os.path.join(out_dir, "run"), epochs=2, steps_per_epoch=2, warmup_ratio=0.5)
    train(cfg, loader, tensorboard=False, progress=False)
    torch.save(seen, os.path.join(out_dir, f"seen{rank}.pt"))


def test_two_process_pretrain_loop(tmp_path, monkeypatch):
    """The real loop under a gloo group: each rank reads its share, rank 0 alone logs and checkpoints."""
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_pretrain_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        assert torch.load(tmp_path / f"seen{rank}.pt") == [(rank, 2, 2, 0), (rank, 2, 2, 1)]
    from moquad.train.checkpoint import load
    from moquad.train.log import read_log

    recs = read_log(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and all(r["loss"] > 0 for r in recs)
    assert [r["mode"] for r in recs] == ["appearance", "appearance", "moquad", "moquad"]
    assert load(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 4


def test_single_process_defaults(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    info = dist.init("cpu")
    assert (info.rank, info.world_size, info.device.type) == (0, 1, "cpu")
    assert dist.get_rank() == 0 and not dist.is_dist()
    x = torch.randn(3, 2)
    assert dist.gather(x) is x
    dist.barrier()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        dist.init("cpu")
    with pytest.raises(ValueError, match="device"):
        dist.pick_device("tpu")


def _preempt_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Only rank 1 gets SIGUSR1 (while its step 2 batch is handed out); both ranks must stop after step 3."""
    import signal
    import sys

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(__file__))
    from test_loop import fake_loader, make_cfg, train

    from moquad.train import preempt

    def loader(*a, **kw):
        for i, batch in enumerate(fake_loader(*a, **kw)):
            if rank == 1 and kw["epoch"] * 4 + kw["start"] + i == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
            yield batch

    try:
        train(make_cfg(os.path.join(out_dir, "run")), loader, tensorboard=False, progress=False)
        torch.save({"step": None}, os.path.join(out_dir, f"stop{rank}.pt"))
    except preempt.Preempted as e:
        torch.save({"step": e.step, "code": e.code}, os.path.join(out_dir, f"stop{rank}.pt"))


def test_two_ranks_stop_at_the_same_step_when_one_is_signalled(tmp_path, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_preempt_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    from moquad.train.checkpoint import load

    assert [torch.load(tmp_path / f"stop{r}.pt") for r in range(2)] == [{"step": 3, "code": 75}] * 2
    assert load(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 3


@pytest.mark.parametrize("setting, world, in_group, device, on, says", [
    (None, 1, False, "cpu", False, ""),  # one process: nothing to synchronise, nothing said
    (None, 2, True, "cuda", True, "SyncBatchNorm on (the default for 2 processes and a BatchNorm backbone)"),
    (None, 8, True, "cpu", False, "SyncBatchNorm off (the default for 8 processes and a BatchNorm backbone; it needs"),
    (False, 2, True, "cuda", False, ""),  # an explicit setting wins
    (True, 1, True, "cuda", True, "SyncBatchNorm on (sync_bn set)"),
])
def test_sync_bn_default_on_for_several_processes_with_batchnorm(monkeypatch, setting, world, in_group, device, on,
                                                                 says):
    monkeypatch.setattr(dist, "is_dist", lambda: in_group)
    bn = torch.nn.Sequential(torch.nn.Conv3d(3, 4, 1), torch.nn.BatchNorm3d(4))
    got, line = dist.sync_bn(setting, bn, world, torch.device(device))
    assert got is on and line.startswith(says) and bool(line) == bool(says)
    assert dist.sync_bn(setting, torch.nn.Linear(3, 4), world, torch.device(device)) == (False, "")  # no BN: off
