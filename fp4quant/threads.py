"""Thread counts of processes that share a machine's cores (a base module: imports only torch)."""

from __future__ import annotations

import os

import torch


def cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pin_threads() -> None:
    """Use exactly OMP_NUM_THREADS threads (torchrun sets it per rank) for every CPU backend:
    an inherited MKL_NUM_THREADS (Snakemake exports the job's threads) would otherwise
    oversubscribe the cores the ranks share."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
