"""The two message exchanges of the compressed collectives: all-to-all and all-gather of
equal byte rows, asynchronous, with the signature of torch's collectives.

    work = exchange.all_to_all(recv, send, group=g, async_op=True)   # row p of send -> rank p
    work = exchange.all_gather(out, shard, group=g, async_op=True)   # shard -> row p of out
    work.wait()

On gloo they are point-to-point transfers with every receive posted before any send;
elsewhere (NCCL) torch's own collectives.  Why: gloo's TCP transport announces a posted
receive to the peer in the same stream as its outgoing data, and a sender waits for that
announcement.  A rank that sends before it receives (gloo's all_to_all_single and
all_gather_into_tensor can) queues the announcement behind its data, so its peer starts
sending only once all of that data has arrived: the two directions of a full-duplex link
take turns.  On the emulated link (60 Mbit/s, 2 MiB each way, 8 calls) torch's
all_to_all_single took 0.58-0.60 s, the same transfers with the receives posted first
0.30-0.40 s (`python -m fp4quant.bench.transfers` under the cluster runner compares them).
A target's NCCL over InfiniBand is full duplex, so the emulation must be too.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

# the point-to-point tag of the exchanges' transfers: matched in the order posted, which
# the collectives keep the same on every rank
TAG = 0x4650


class Transfers:
    """The works of one exchange's point-to-point transfers: ``wait()`` waits for all."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def point_to_point(group: Any, tensor: torch.Tensor) -> bool:
    """Whether an exchange of ``tensor`` on ``group`` runs as receive-first transfers: host
    tensors on a group with gloo."""
    return tensor.device.type == "cpu" and "gloo" in str(dist.get_backend(group))


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _transfers(recv_rows: torch.Tensor, send_row, group: Any) -> Transfers:
    """Row p of ``recv_rows`` from group rank p, ``send_row(p)`` to rank p: receives first."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    peers = [(rank + k) % world for k in range(1, world)]  # each rank sends to a different peer first
    works = [dist.irecv(recv_rows[(rank - k) % world], _global(group, (rank - k) % world), group=group, tag=TAG)
             for k in range(1, world)]
    works += [dist.isend(send_row(p), _global(group, p), group=group, tag=TAG) for p in peers]
    recv_rows[rank].copy_(send_row(rank))
    return Transfers(works)


def all_to_all(recv: torch.Tensor, send: torch.Tensor, group: Any = None, async_op: bool = False):
    """``torch.distributed.all_to_all_single(recv, send)`` with equal splits: W rows of
    ``send`` (dim 0 split in W), row p to rank p; row p of ``recv`` from rank p."""
    world = dist.get_world_size(group)
    if recv.shape != send.shape or recv.dtype != send.dtype or send.shape[0] % world:
        raise ValueError(f"all_to_all: recv {tuple(recv.shape)} {recv.dtype} and send {tuple(send.shape)} "
                         f"{send.dtype} must match, dim 0 a multiple of the world size {world}")
    if not point_to_point(group, send):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return dist.all_to_all_single(recv, send, group=group, async_op=async_op)
    send_rows, recv_rows = send.reshape(world, -1), recv.view(world, -1)
    work = _transfers(recv_rows, lambda p: send_rows[p], group)
    if async_op:
        return work
    work.wait()
    return None


def all_gather(out: torch.Tensor, shard: torch.Tensor, group: Any = None, async_op: bool = False):
    """``torch.distributed.all_gather_into_tensor(out, shard)``: ``out`` holds W copies'
    worth of values, row p rank p's ``shard``."""
    world = dist.get_world_size(group)
    if out.numel() != world * shard.numel() or out.dtype != shard.dtype:
        raise ValueError(f"all_gather: out {tuple(out.shape)} {out.dtype} must hold {world} x shard "
                         f"{tuple(shard.shape)} {shard.dtype}")
    if not point_to_point(group, shard):
        flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return flat(out, shard, group=group, async_op=async_op)
    src = shard.reshape(-1)
    work = _transfers(out.view(world, -1), lambda p: src, group)
    if async_op:
        return work
    work.wait()
    return None
