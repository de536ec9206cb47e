"""Rank bodies of tests/test_distributed.py (the launcher's own tests)."""

from __future__ import annotations

import os
import sys
import time

import torch


def identity(rank: int, world: int) -> dict:
    """What tells a forked rank from a fresh one, and what must not."""
    return {"rank": rank, "world": world, "parent": os.getppid(), "seed": torch.initial_seed(),
            "draw": torch.rand(3).tolist(), "threads": torch.get_num_threads(),
            "backend": os.environ.get("FP4QUANT_BACKEND"), "argv0": sys.argv[0]}


def fail_on_rank_one(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank one says no")
    time.sleep(60)  # the launcher kills it as soon as rank 1 has failed


def hang(rank: int, world: int) -> None:
    time.sleep(600)
