"""The world as a DP x TP grid: tensor-parallel groups of consecutive ranks (inside a node
when TP <= GPUs per node), data-parallel groups across them."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelMesh:
    world: int
    rank: int
    tp: int
    tp_rank: int
    dp: int
    dp_rank: int
    tp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None

    @classmethod
    def single(cls) -> ParallelMesh:
        """One process, no process groups (TP = DP = 1)."""
        return cls(1, 0, 1, 0, 1, 0, None, None)


def check_layout(world: int, tp: int) -> None:
    if tp < 1 or world < 1 or world % tp:
        raise ValueError(f"world size {world} is not divisible by the tensor-parallel size {tp}")


def init_mesh(tp: int) -> ParallelMesh:
    """Split the initialized default process group into TP groups [d*tp, (d+1)*tp) and DP groups."""
    world, rank = dist.get_world_size(), dist.get_rank()
    check_layout(world, tp)
    dp = world // tp
    tp_group = dp_group = None
    # every rank must create every group, in the same order
    for d in range(dp):
        g = dist.new_group(list(range(d * tp, (d + 1) * tp)))
        if rank // tp == d:
            tp_group = g
    for t in range(tp):
        g = dist.new_group(list(range(t, world, tp)))
        if rank % tp == t:
            dp_group = g
    return ParallelMesh(world, rank, tp, rank % tp, dp, rank // tp, tp_group, dp_group)
