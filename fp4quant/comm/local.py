"""Ranks as threads of one process: the transport of simulated tensor-parallel ranks.

``LocalGroup(W).ranks()`` gives W ``LocalRank`` handles; a thread per rank passes its handle as
the ``group`` of fp4quant's collectives (and of a TPCommunicator).  The collectives then run
the same algorithms -- the same messages from the same shards, the same codec calls, the same
stochastic-rounding streams keyed by rank -- as over torch.distributed; only the transport
differs: a rank puts what it sends in its slot, every rank waits for the others, copies what
is addressed to it, and waits again before a slot is reused.  An uncompressed sum adds the
ranks' tensors in rank order.  An exception in one thread breaks the barrier, so the others
raise instead of waiting forever.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class LocalGroup:
    """W ranks of one process (one thread each), and the slots their exchanges meet in."""

    def __init__(self, world: int, timeout_s: float | None = 600.0, running: int | None = None):
        """``running``: at most this many ranks compute at once (a rank gives its turn up while it
        waits for the others): W threads on fewer cores then take turns instead of contending."""
        if not isinstance(world, int) or world < 1:
            raise ValueError(f"a local group needs a positive number of ranks, got {world!r}")
        self.world = world
        self.barrier = _TurnBarrier(world, timeout_s, threading.BoundedSemaphore(running) if running else None)
        self.slots: list[Any] = [None] * world
        self.parts: list[Any] = [None] * world  # an all-reduce's second meeting (its reduced parts)

    def ranks(self) -> list[LocalRank]:
        return [LocalRank(self, r) for r in range(self.world)]

    def abort(self) -> None:
        """Break every rank out of its wait (a rank failed)."""
        self.barrier.abort()


class _TurnBarrier(threading.Barrier):
    """A barrier whose waiters give up their turn (``turns``, held by a running rank) while they wait."""

    def __init__(self, parties: int, timeout: float | None, turns: threading.BoundedSemaphore | None):
        super().__init__(parties, timeout=timeout)
        self.turns = turns

    def wait(self, timeout: float | None = None) -> int:
        if self.turns is None:
            return super().wait(timeout)
        self.turns.release()
        try:
            return super().wait(timeout)
        finally:
            self.turns.acquire()


class Done:
    """The finished work of a local exchange (it completes before it returns)."""

    def wait(self) -> bool:
        return True


class LocalRank:
    """One rank's handle on a LocalGroup: the ``group`` its collectives take."""

    def __init__(self, group: LocalGroup, rank: int):
        self.group, self.rank = group, rank

    @property
    def world(self) -> int:
        return self.group.world

    def _meet(self, mine: Any) -> list[Any]:
        """Every rank's ``mine`` (after the others put theirs), valid until the next meeting."""
        g = self.group
        g.slots[self.rank] = mine
        g.barrier.wait()
        return list(g.slots)

    def _leave(self) -> None:
        self.group.barrier.wait()  # nobody overwrites a slot another rank still reads

    def exchange(self, recv_rows: torch.Tensor, send_rows: torch.Tensor, peers: list[int] | None) -> Done:
        """Row p of ``recv_rows`` from peer p, row p of ``send_rows`` to it (as exchange._transfers)."""
        peers = list(range(self.world)) if peers is None else peers
        everyone = self._meet((peers, send_rows))
        for p, peer in enumerate(peers):
            their_peers, their_rows = everyone[peer]
            recv_rows[p].copy_(their_rows[their_peers.index(self.rank)])
        self._leave()
        return Done()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Sum (or "max") in rank order, element by element: each rank reduces its 1/W of the
        values (the work is shared, not repeated W times), then every rank copies every part."""
        flat = tensor.view(-1)
        everyone = self._meet(flat)
        step = -(-flat.numel() // self.world)
        lo, hi = min(self.rank * step, flat.numel()), min((self.rank + 1) * step, flat.numel())
        part = everyone[0][lo:hi].clone()
        for other in everyone[1:]:
            if op == "max":
                torch.maximum(part, other[lo:hi], out=part)
            else:
                part += other[lo:hi]
        g = self.group
        g.parts[self.rank] = part  # its own slots: a slower rank may still be reading ``slots``
        g.barrier.wait()  # every rank has read every input: the inputs may be written
        torch.cat(list(g.parts), out=flat)
        self._leave()

    def reduce_scatter(self, out: torch.Tensor, src: torch.Tensor) -> None:
        """``out`` = the sum over ranks of row ``rank`` of each rank's ``src`` (world rows)."""
        everyone = self._meet(src.view(self.world, -1))
        result = everyone[0][self.rank].clone()
        for other in everyone[1:]:
            result += other[self.rank]
        self._leave()
        out.copy_(result.view_as(out))

    def all_gather_object(self, obj: Any) -> list[Any]:
        everyone = self._meet(obj)
        self._leave()
        return everyone

    def barrier(self) -> None:
        self.group.barrier.wait()


def run_ranks(group: LocalGroup, fn) -> list[Any]:
    """``fn(handle)`` on a thread per rank of ``group``; the results in rank order.  A rank's
    exception breaks the others' waits and is raised here (the first rank that failed)."""
    results: list[Any] = [None] * group.world
    errors: list[BaseException | None] = [None] * group.world

    def body(handle: LocalRank) -> None:
        try:
            results[handle.rank] = fn(handle)
        except BaseException as exc:  # noqa: BLE001 -- handed to the calling thread
            errors[handle.rank] = exc
            group.abort()

    threads = [threading.Thread(target=body, args=(h,), name=f"fp4quant-rank{h.rank}", daemon=True)
               for h in group.ranks()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [e for e in errors if e is not None]
    if failed:
        raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
    return results


def is_local(group: Any) -> bool:
    return isinstance(group, LocalRank)
