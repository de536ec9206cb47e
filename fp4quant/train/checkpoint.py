"""Checkpoints that a kill at any moment cannot corrupt.

Each rank writes its own shard (model, optimizer, step, RNG states) into
``checkpoints/step_N.tmp/``; after a barrier rank 0 renames the folder to ``step_N``
and then atomically rewrites ``checkpoints/latest``.  A folder only becomes visible
complete, and ``latest`` only ever names a complete one; older ones are pruned.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..provenance import atomic_torch_save, atomic_write_text


def _dir(out: Path) -> Path:
    return out / "checkpoints"


def latest_step(out: Path) -> int | None:
    pointer = _dir(out) / "latest"
    if not pointer.exists():
        return None
    step = int(pointer.read_text().strip())
    return step if (_dir(out) / f"step_{step:06d}").is_dir() else None


def save(out: Path, step: int, rank: int, world: int, state: dict[str, Any], keep: int) -> None:
    ckpt = _dir(out)
    tmp = ckpt / f"step_{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if world > 1:
        dist.barrier()
    atomic_torch_save(state, tmp / f"rank{rank:04d}.pt")
    if world > 1:
        dist.barrier()
    if rank == 0:
        final = ckpt / f"step_{step:06d}"
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_text(ckpt / "latest", f"{step}\n")
        done = sorted(p for p in ckpt.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    if world > 1:
        dist.barrier()


def load(out: Path, step: int, rank: int) -> dict[str, Any]:
    path = _dir(out) / f"step_{step:06d}" / f"rank{rank:04d}.pt"
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} is missing: was the run restarted with another world size?")
    return torch.load(path, map_location="cpu", weights_only=False)
