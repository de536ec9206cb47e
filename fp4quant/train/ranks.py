"""The trainer's ranks: torch.distributed's processes, or threads of one process.

``Ranks`` is the little the training loop asks of its world besides the TP traffic (which
goes through the model's TPCommunicator): small uncompressed reductions, objects gathered or
broadcast, barriers, and the mesh.  ``ProcessRanks`` are torch.distributed's (or the one
process of a run without torchrun); ``SimulatedRanks`` are the threads of ``--simulate-tp``
(fp4quant.comm.local), whose reductions add the ranks' tensors in rank order.  The TP sums
the loop takes are ``ordered_sum``s: in rank order on both, so both compute the same bits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..comm.local import LocalRank
from ..parallel import ParallelMesh, init_mesh


class ProcessRanks:
    """torch.distributed's default group, or one process when it is not initialized."""

    simulated = False

    def __init__(self) -> None:
        self.distributed = dist.is_initialized()
        self.world = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0

    @property
    def backend(self) -> str | None:
        return str(dist.get_backend()) if self.distributed else None

    def mesh(self, tp: int) -> ParallelMesh:
        return init_mesh(tp) if self.distributed else ParallelMesh.single()

    def all_reduce(self, t: torch.Tensor, group: Any = None, op: str = "sum") -> None:
        """Sum (or "max") ``t`` over ``group`` (None: the world) in place."""
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)

    def ordered_sum(self, t: torch.Tensor, group: Any) -> None:
        """Sum ``t`` over ``group`` in place, gathered and added in rank order: the same bits
        as a simulated group's sum, whatever order the backend's all-reduce adds in (for the
        step's small sums: the TP gradient norm, sequence-parallel replicated gradients)."""
        n = dist.get_world_size(group) if self.distributed else 1
        if n == 1:
            return
        parts = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(parts, t.contiguous(), group=group)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        t.copy_(total)

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, obj)
        return everyone

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


class SimulatedRanks:
    """One thread's rank of a simulated TP group (fp4quant.comm.local): TP = the world, DP = 1."""

    backend = "simulated"
    distributed = False
    simulated = True

    def __init__(self, handle: LocalRank) -> None:
        self.handle = handle
        self.world, self.rank = handle.world, handle.rank

    def mesh(self, tp: int) -> ParallelMesh:
        if tp != self.world:
            raise ValueError(f"simulated ranks form one TP group: TP {tp} for {self.world} ranks")
        return ParallelMesh(self.world, self.rank, tp, self.rank, 1, 0, self.handle, None)

    def all_reduce(self, t: torch.Tensor, group: Any = None, op: str = "sum") -> None:
        if group is not None and group is not self.handle:
            raise ValueError("simulated ranks reduce over their one TP group only")
        self.handle.all_reduce(t, op)

    def ordered_sum(self, t: torch.Tensor, group: Any) -> None:
        self.all_reduce(t, group)  # a local group adds in rank order

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.handle.all_gather_object(obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.handle.all_gather_object(obj)[src]

    def barrier(self) -> None:
        self.handle.barrier()


Ranks = ProcessRanks | SimulatedRanks
