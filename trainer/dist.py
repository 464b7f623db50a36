"""`torch.distributed` helpers that also work in a single process (no process group).

    >>> world()
    (0, 1)
    >>> all_reduce_sum(torch.tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    >>> broadcast_int(7)
    7
    >>> per_rank(5)
    [5]

A rank waits at most `TETHER_COLLECTIVE_TIMEOUT_S` (default 120 s; torch's own default is 30 minutes) in a
collective: a peer whose host went silent (a partition drops its packets, nothing resets the connection) then
fails the rank, and torchrun re-rendezvouses without it instead of hanging for half an hour. Keep it above the
longest legitimate wait between collectives (rank 0 publishing weights to the gateway: up to 60 s).
"""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["all_reduce_max", "all_reduce_sum", "barrier", "broadcast_int", "broadcast_tensor", "collective_timeout",
           "device", "init", "is_distributed", "param_digests", "per_rank", "shutdown", "world"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world_size); (0, 1) without a process group."""
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def device() -> torch.device:
    """This rank's device: its CUDA device when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init() -> tuple[int, int]:
    """Join the process group torchrun described in the environment (NCCL with CUDA, else gloo)."""
    torch.set_num_threads(1)
    if "WORLD_SIZE" not in os.environ or is_distributed():
        return world()
    # `--standalone` torchrun keeps one store across restarts: a restarted group must not read the
    # gloo/NCCL addresses its dead predecessor published there, so every attempt gets its own key
    # prefix. Multi-node (trainer.main sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), rank 0 of each
    # rendezvous round hosts a new store on a new port, and the nodes' restart counts differ (a
    # node that rejoins starts at 0): no prefix there.
    store, rank, world_size = next(dist.rendezvous("env://"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "False":
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"tether/attempt-{attempt}", store)
    timeout = collective_timeout()
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, device_id=device(),
                                timeout=timeout)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    return world()


def collective_timeout() -> timedelta:
    """`$TETHER_COLLECTIVE_TIMEOUT_S` (default 120 s): how long a collective waits for a silent peer.

    >>> collective_timeout().total_seconds()
    120.0
    """
    text = os.environ.get("TETHER_COLLECTIVE_TIMEOUT_S", "120")
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise SystemExit(f"tether train: TETHER_COLLECTIVE_TIMEOUT_S must be a number of seconds > 0, got {text!r}")
    return timedelta(seconds=seconds)


def shutdown() -> None:
    if is_distributed():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place (and returned)."""
    if is_distributed():
        moved = tensor.to(device())
        dist.all_reduce(moved)
        tensor.copy_(moved.to(tensor.device))
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Maximum over ranks, in place (and returned)."""
    if is_distributed():
        moved = tensor.to(device())
        dist.all_reduce(moved, op=dist.ReduceOp.MAX)
        tensor.copy_(moved.to(tensor.device))
    return tensor


def broadcast_int(value: int, *, src: int = 0) -> int:
    """`value` as rank `src` has it, on every rank."""
    if not is_distributed():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=device())
    dist.broadcast(t, src=src)
    return int(t.item())


def broadcast_tensor(tensor: torch.Tensor, *, src: int = 0) -> torch.Tensor:
    """`tensor` as rank `src` has it, in place on every rank (same shape and dtype everywhere)."""
    if is_distributed():
        moved = tensor.to(device())
        dist.broadcast(moved, src=src)
        tensor.copy_(moved.to(tensor.device))
    return tensor


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def per_rank(value: int) -> list[int]:
    """`value` of every rank, in rank order."""
    rank, world_size = world()
    slots = torch.zeros(world_size, dtype=torch.int64)
    slots[rank] = int(value)
    return [int(v) for v in all_reduce_sum(slots).tolist()]


def param_digests(module: torch.nn.Module) -> list[str]:
    """sha256 of each rank's parameters and buffers, for every rank (identical under DDP)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    rank, world_size = world()
    slots = torch.zeros(world_size, 32, dtype=torch.int64)
    slots[rank] = torch.tensor(list(h.digest()), dtype=torch.int64)
    return [bytes(int(b) for b in row).hex() for row in all_reduce_sum(slots).tolist()]
