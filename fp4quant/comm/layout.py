"""Which ranks of a group share a node: the layout a hierarchical all-reduce follows.

Ranks of a node are consecutive in the global ranks torchrun assigns, LOCAL_WORLD_SIZE to a
node; a group's members are placed by their global rank (so a TP group inside a larger
world works), or ``ranks_per_node`` consecutive group ranks a node when the caller says so.
Every node must hold the same number of the group's ranks.  A rank's *node peers* are the
group ranks of its node; its *rail peers* the group ranks with its local index on every
node (the rail-aligned ranks that share a NIC's rail on a DGX-class cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class NodeLayout:
    nodes: tuple[tuple[int, ...], ...]  # the group ranks of each node, by local index

    @property
    def ranks_per_node(self) -> int:
        return len(self.nodes[0])

    def node_of(self, rank: int) -> int:
        return next(n for n, members in enumerate(self.nodes) if rank in members)

    def local_index(self, rank: int) -> int:
        return self.nodes[self.node_of(rank)].index(rank)

    def node_peers(self, rank: int) -> list[int]:
        return list(self.nodes[self.node_of(rank)])

    def rail_peers(self, rank: int) -> list[int]:
        local = self.local_index(rank)
        return [members[local] for members in self.nodes]

    @classmethod
    def consecutive(cls, world: int, ranks_per_node: int) -> NodeLayout:
        if not isinstance(ranks_per_node, int) or isinstance(ranks_per_node, bool) or ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be a positive int, got {ranks_per_node!r}")
        if world % ranks_per_node:
            raise ValueError(f"ranks_per_node {ranks_per_node} does not divide the group's {world} ranks")
        return cls(tuple(tuple(range(n, n + ranks_per_node)) for n in range(0, world, ranks_per_node)))

    @classmethod
    def of(cls, group, ranks_per_node: int | None = None) -> NodeLayout:
        """The layout of ``group``: ``ranks_per_node`` consecutive group ranks a node, else
        torchrun's LOCAL_WORLD_SIZE over the members' global ranks; ValueError in one line."""
        from .local import is_local

        world = group.world if is_local(group) else dist.get_world_size(group)
        if ranks_per_node is not None:
            return cls.consecutive(world, ranks_per_node)
        if is_local(group):
            raise ValueError("simulated ranks have no torchrun layout: pass ranks_per_node")
        raw = os.environ.get("LOCAL_WORLD_SIZE", "")
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError("the node layout is unknown: run under torchrun (LOCAL_WORLD_SIZE) or pass "
                             "ranks_per_node")
        local_world = int(raw)
        by_node: dict[int, list[int]] = {}
        for r in range(world):
            g = r if group is None else dist.get_global_rank(group, r)
            by_node.setdefault(g // local_world, []).append(r)
        counts = {node: len(members) for node, members in by_node.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"the group's ranks are spread unevenly over the nodes (ranks a node: {counts}; "
                             f"LOCAL_WORLD_SIZE={local_world})")
        return cls(tuple(tuple(members) for _, members in sorted(by_node.items())))

    def describe(self) -> str:
        return f"{len(self.nodes)} node(s) x {self.ranks_per_node} rank(s)"
