"""``--simulate-tp``: the --tp ranks of a run as threads of one process.

Each thread is a whole rank -- its Trainer, its shard of every parallel layer, its
TPCommunicator -- and their collectives meet in memory (fp4quant.comm.local): the same
messages from the same shards, the same codec calls, the same stochastic-rounding streams
keyed by rank as torchrun's ranks over gloo, so the losses are theirs (tests/train/
test_simulate.py holds them to the real ranks' at every step).  What differs is the
transport: no sockets, no process per rank, so TP = 16 trains on a 2-core machine.  The
uncompressed reductions add the ranks' tensors in rank order, where gloo's ring may add
them in another order (a last-bit difference at more than two ranks).

Each rank runs its ops on cores // W threads (at least one), and no more ranks compute at once
than the cores hold: a rank waiting for the others gives its turn up (W threads contending
for two cores spend a fifth of their time switching otherwise).  The ranks' counters
(fp4quant.comm.stats) are per thread, so rank 0's log records one rank's traffic, as a
real run's does.  A rank that fails breaks the others out of their waits; the first
failure (lowest rank) is raised in the calling thread.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..comm.local import LocalGroup, LocalRank, run_ranks
from ..data import TokenDataset
from ..threads import cores
from .loop import Trainer
from .ranks import SimulatedRanks
from .train_config import TrainConfig


def _op_threads() -> int:
    """The process's op threads: OMP_NUM_THREADS when set, else the cores."""
    return int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() else cores()


def threads_per_rank(world: int) -> int:
    """Op threads each simulated rank uses: the process's shared out."""
    return max(1, _op_threads() // world)


def run(cfg: TrainConfig, data: TokenDataset | None = None) -> dict[str, Any]:
    """Train ``cfg`` (simulate_tp set) with its --tp ranks as threads; rank 0's summary."""
    threads = threads_per_rank(cfg.tp)
    running = max(1, _op_threads() // threads)  # ranks computing at once: one per core's worth of op threads
    # a rank's failure aborts the group: no timeout needed
    group = LocalGroup(cfg.tp, timeout_s=None, running=running if running < cfg.tp else None)
    turns = group.barrier.turns

    def rank_main(handle: LocalRank) -> dict[str, Any]:
        torch.set_num_threads(threads)  # this thread's op threads
        if turns is not None:
            turns.acquire()
        try:
            return Trainer(cfg, data, SimulatedRanks(handle)).run()
        finally:
            if turns is not None:
                turns.release()

    summaries = run_ranks(group, rank_main)
    return summaries[0]
