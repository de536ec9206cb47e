"""The two message exchanges of the compressed collectives: all-to-all and all-gather of
equal rows, asynchronous, with the signature of torch's collectives.

    work = exchange.all_to_all(recv, send, group=g, async_op=True)   # row p of send -> rank p
    work = exchange.all_gather(out, shard, group=g, async_op=True)   # shard -> row p of out
    work.wait()

``peers`` (group ranks, in order) runs either among a subset of the group, row p for
peers[p]: the ranks of one node, or the ranks of one rail (the same local rank on every
node), for the hierarchical all-reduce; point-to-point transfers on the parent group, so
no process group is created (creating one is collective over the whole world).

On gloo (host tensors) they are point-to-point transfers with every receive posted before
any send; elsewhere (NCCL) torch's own collectives.  Why: gloo's TCP transport sends data
only once the peer has announced the matching receive, and announces a receive in the same
first-in-first-out stream as its outgoing data.  A rank that sends before it receives (as
gloo's all-to-all and all-gather do) queues its announcement behind its data, so its peer
starts sending only once all of that data has arrived: the two directions of a full-duplex
link take turns.  On the emulated link (60 Mbit/s, 2 MiB each way, 8 calls) torch's
all_to_all_single took 0.58-0.60 s, the same transfers with the receives posted first
0.30-0.40 s (`python -m fp4quant.bench.transfers` under the cluster runner compares them).
A target's NCCL over InfiniBand is full duplex, so the emulation must be too.  With two
exchanges in flight between a pair (the chunked pipeline), the second's announcements wait
behind the first's data: a gap of a round trip, not turns.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from .local import is_local

# The tag of the exchanges' transfers (0x4650: "FP"); no other point-to-point traffic on the
# group may use it.  Transfers with one tag match in the order posted, which the collectives
# keep the same on every rank.
TAG = 0x4650


class Transfers:
    """The works of one exchange's point-to-point transfers: ``wait()`` waits for all."""

    def __init__(self, works: list[Any]):
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True


def receives_first(group: Any, tensor: torch.Tensor) -> bool:
    """Whether an exchange of ``tensor`` on ``group`` runs as receive-first transfers: host
    tensors on a group with gloo."""
    return tensor.device.type == "cpu" and "gloo" in str(dist.get_backend(group))


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _check(name: str, dst: torch.Tensor, src: torch.Tensor, dst_numel: int, world: int) -> None:
    """One line naming the first thing wrong with an exchange's tensors."""
    if world < 1:
        raise ValueError(f"{name}: this rank is not a member of the group")
    if src.dim() == 0:
        raise ValueError(f"{name}: the input must have at least one dimension, got a scalar")
    if dst.device != src.device:
        raise ValueError(f"{name}: output on {dst.device} but input on {src.device}")
    if dst.dtype != src.dtype:
        raise ValueError(f"{name}: output dtype {dst.dtype} but input dtype {src.dtype}")
    if dst.numel() != dst_numel:
        raise ValueError(f"{name}: output holds {dst.numel()} values, expected {dst_numel} "
                         f"(input {tuple(src.shape)})")
    if not dst.is_contiguous():
        raise ValueError(f"{name}: the output must be contiguous")


def _transfers(recv_rows: torch.Tensor, send_rows: torch.Tensor, group: Any, async_op: bool,
               peers: list[int] | None = None):
    """Row p of ``recv_rows`` from peer p and row p of ``send_rows`` to it (both (W, n); peers:
    group ranks, default the whole group): every receive posted, then every send; each rank
    sends to a different peer first.  Host tensors on gloo: irecv / isend; device tensors
    (NCCL): one batch of point-to-point operations."""
    peers = list(range(recv_rows.shape[0])) if peers is None else peers
    world, me = len(peers), peers.index(dist.get_rank(group))
    sources = [(me - k) % world for k in range(1, world)]
    targets = [(me + k) % world for k in range(1, world)]
    if receives_first(group, recv_rows):
        works = [dist.irecv(recv_rows[p], _global_rank(group, peers[p]), group=group, tag=TAG) for p in sources]
        works += [dist.isend(send_rows[p], _global_rank(group, peers[p]), group=group, tag=TAG) for p in targets]
    else:
        ops = [dist.P2POp(dist.irecv, recv_rows[p], _global_rank(group, peers[p]), group) for p in sources]
        ops += [dist.P2POp(dist.isend, send_rows[p].contiguous(), _global_rank(group, peers[p]), group)
                for p in targets]
        works = dist.batch_isend_irecv(ops) if ops else []
    recv_rows[me].copy_(send_rows[me])
    work = Transfers(works)
    if async_op:
        return work
    work.wait()
    return None


def _check_peers(name: str, group: Any, peers: list[int]) -> None:
    if dist.get_rank(group) not in peers:
        raise ValueError(f"{name}: this rank ({dist.get_rank(group)}) is not among the peers {peers}")
    if len(set(peers)) != len(peers):
        raise ValueError(f"{name}: the peers {peers} repeat a rank")


def _torch_collective(fn, *args: Any, group: Any, async_op: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated spelling of older torch
        return fn(*args, group=group, async_op=async_op)


def all_to_all(recv: torch.Tensor, send: torch.Tensor, group: Any = None, async_op: bool = False,
               peers: list[int] | None = None):
    """``torch.distributed.all_to_all_single(recv, send)`` with equal splits: ``send``'s
    dim 0 split in W rows, row p to rank p; row p of ``recv`` from rank p (with ``peers``:
    W = len(peers), row p to and from peers[p])."""
    world = (group.world if is_local(group) else dist.get_world_size(group)) if peers is None else len(peers)
    _check("all_to_all", recv, send, send.numel(), world)
    if send.shape[0] % world:
        raise ValueError(f"all_to_all: input dim 0 ({send.shape[0]}) is not a multiple of the world size {world}")
    if is_local(group):  # simulated ranks: threads of this process (fp4quant.comm.local)
        return group.exchange(recv.view(world, -1), send.reshape(world, -1), peers)
    if peers is not None:
        _check_peers("all_to_all", group, peers)
    elif not receives_first(group, send):
        return _torch_collective(dist.all_to_all_single, recv, send, group=group, async_op=async_op)
    return _transfers(recv.view(world, -1), send.reshape(world, -1), group, async_op, peers)


def all_gather(out: torch.Tensor, shard: torch.Tensor, group: Any = None, async_op: bool = False,
               peers: list[int] | None = None):
    """``torch.distributed.all_gather_into_tensor(out, shard)``: ``out`` holds W x
    ``shard.numel()`` values, row p rank p's ``shard`` (with ``peers``: peers[p]'s)."""
    world = (group.world if is_local(group) else dist.get_world_size(group)) if peers is None else len(peers)
    _check("all_gather", out, shard, world * shard.numel(), world)
    if is_local(group):
        return group.exchange(out.view(world, -1), shard.reshape(1, -1).expand(world, -1), peers)
    if peers is not None:
        _check_peers("all_gather", group, peers)
    elif not receives_first(group, shard):
        flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return _torch_collective(flat, out, shard, group=group, async_op=async_op)
    return _transfers(out.view(world, -1), shard.reshape(1, -1).expand(world, -1), group, async_op, peers)
