"""Distributed helpers driven only by torchrun's environment (RANK / LOCAL_RANK / WORLD_SIZE).

``init()`` starts a process group when ``WORLD_SIZE > 1`` (NCCL on GPU, gloo on CPU) and is a
no-op otherwise, so the same training code runs single-process on a laptop and multi-node on a
cluster. ``gather`` concatenates a tensor from every rank *with gradients flowing back* to the
rank that produced each slice: contrastive losses need every rank's projections as negatives.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from moquad.errors import MoquadError, setting


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def env_ranks() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment variables (0, 0, 1 when absent)."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return rank, local_rank, world


def pick_device(want: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` -> this process's GPU when CUDA is available, else CPU."""
    if want not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {want!r}")
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device cuda requested but CUDA is not available; use {setting('device', 'cpu')}")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init(device: str = "auto") -> DistInfo:
    """Start the process group from the environment and pick this rank's device.

    A group is started when WORLD_SIZE > 1, or under torchrun with one process (MASTER_ADDR set), so that
    ``torchrun --nproc-per-node 1`` runs the same DDP / NCCL path as a multi-GPU job.
    """
    rank, local_rank, world = env_ranks()
    dev = pick_device(device, local_rank)
    launched = world > 1 or ("WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ)
    if launched and not dist.is_initialized():
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise ValueError(f"WORLD_SIZE={world} but {var} is not set; launch with torchrun")
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world, **kwargs)
    return DistInfo(rank, local_rank, world, dev)


def cleanup() -> None:
    """Destroy the process group if one is running, and free it now.

    A group left to the interpreter's teardown can end the process with SIGABRT (gloo's worker threads
    release Python objects after the interpreter is gone; pytorch/pytorch#179291), so every command that
    may start one calls this on its way out, on success or error (no collective here: a peer may be gone).
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


def is_dist() -> bool:
    """True inside a process group (torchrun), whatever its size."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_dist() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def barrier() -> None:
    if is_dist():
        dist.barrier()


class GatherLayer(torch.autograd.Function):
    """all_gather whose backward sums every rank's gradient for this rank's slice.

    Forward returns one tensor per rank. Backward all-reduces (sums) the incoming gradients
    and keeps this rank's slice, so d(sum of all ranks' losses)/d(local input) is exact. With
    DDP averaging parameter gradients over ranks this equals single-process training on the
    global batch with the loss averaged over ranks.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor):  # type: ignore[override]
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):  # type: ignore[override]
        all_grads = torch.stack(grads)
        dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)
        return all_grads[dist.get_rank()]


def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all ranks along dim 0 (rank order), differentiable; identity if single."""
    if not is_dist():
        return x
    return torch.cat(GatherLayer.apply(x), dim=0)


def gather_ids(x: torch.Tensor) -> torch.Tensor:
    """Concatenate an integer tensor (e.g. video indices) from all ranks along dim 0; no gradient."""
    if not is_dist():
        return x
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out)


def all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``sum``, ``max`` or ``mean`` of a (detached) tensor over ranks; the tensor itself if single-process."""
    if not is_dist():
        return x
    x = x.detach().clone()
    dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return x / dist.get_world_size() if op == "mean" else x


@contextmanager
def on_main(cm: AbstractContextManager, device: torch.device) -> Iterator[None]:
    """Enter ``cm`` on rank 0 only (e.g. the writer lock); if it raises there, every rank raises (none hangs)."""
    with ExitStack() as stack:
        failed: Exception | None = None
        if get_rank() == 0:
            try:
                stack.enter_context(cm)
            except Exception as e:  # re-raised below, after the other ranks know
                failed = e
        flag = all_reduce(torch.tensor([float(failed is not None)], device=device), "max")
        if failed is not None:
            raise failed
        if float(flag[0]):
            raise MoquadError("rank 0 could not start this run; its error line says why")
        yield


def sync_bn(setting: bool | None, model: torch.nn.Module, world: int, device: torch.device) -> tuple[bool, str]:
    """(use SyncBatchNorm?, the line saying so or ''): ``setting`` when given, else on as soon as world size > 1
    and the model has BatchNorm (per-rank BN statistics tell a rank's clips apart: SimCLR's BN leakage).
    It needs GPU processes in a group (NCCL)."""
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    want = has_bn and (setting if setting is not None else world > 1)
    if not want:
        return False, ""
    on = is_dist() and device.type == "cuda"
    why = "sync_bn set" if setting is not None else f"the default for {world} processes and a BatchNorm backbone"
    note = "" if on else "; it needs GPU processes under torchrun, so each process keeps its own BatchNorm"
    return on, f"SyncBatchNorm {'on' if on else 'off'} ({why}{note})"


def my_rows(n: int) -> list[int]:
    """This rank's share of ``n`` items for evaluation: rows r, r+W, r+2W, ... (no padding, no drop)."""
    return list(range(get_rank(), n, get_world_size()))


def gather_rows(rows: list[int], values: np.ndarray, n: int) -> np.ndarray:
    """Every rank's ``values`` (one row per item of ``rows``) in item order 0..n-1, on every rank.

    Raises unless every item was computed exactly once (a silent gap would change a metric).
    """

    if is_dist():
        gathered: list = [None] * get_world_size()
        dist.all_gather_object(gathered, (rows, values))
        rows = [i for g in gathered for i in g[0]]
        values = np.concatenate([g[1] for g in gathered if len(g[0])])
    if sorted(rows) != list(range(n)):
        raise RuntimeError(f"evaluation covered {len(set(rows))} distinct of {n} videos ({len(rows)} computed); "
                           "every video must be counted exactly once")
    ordered = np.empty_like(values)
    ordered[np.asarray(rows)] = values
    return ordered
