"""TrafficCapture: what crosses the wire in tensor parallelism, saved for offline study.

A TPCommunicator given a capture hands it, at the chosen steps, this rank's contribution
to each TP collective (before the collective, in the tensor's own dtype, on the CPU),
per direction in call order:

    capture = TrafficCapture(folder, steps=(1, 30, 59), rank=tp.rank)
    tp = TPCommunicator(group, config, capture=capture)
    tp.start_step(step)           # starts recording when ``step`` is one of ``steps``
    ... forward, backward ...
    capture.save()                # step<step>-rank<rank>.pt in ``folder``, atomically

Call k of a direction is the k-th collective of that direction in the step: forward,
the row-parallel outputs (and the vocab-parallel embedding's) in layer order; backward,
the input gradients of the column-parallel layers in reverse layer order.  Off (no
capture, or a step not chosen) it costs one attribute test per collective.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..provenance import atomic_write_bytes

DIRECTIONS = ("fwd", "bwd")
FILE_PATTERN = re.compile(r"step(\d+)-rank(\d+)\.pt")


def capture_file(folder: str | Path, step: int, rank: int) -> Path:
    return Path(folder) / f"step{step:06d}-rank{rank}.pt"


class TrafficCapture:
    """Records each direction's tensors at ``steps`` and saves one file per step and rank."""

    def __init__(self, folder: str | Path, steps: Iterable[int], rank: int = 0, meta: dict[str, Any] | None = None):
        steps = tuple(sorted(set(steps)))
        if not steps:
            raise ValueError("a TrafficCapture needs at least one step to capture")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in steps):
            raise ValueError(f"capture steps must be integers >= 0, got {steps}")
        self.folder = Path(folder)
        self.steps = frozenset(steps)
        self.rank = rank
        # saved with every file (model, configuration, provenance), as plain JSON values: the
        # files load with torch.load(weights_only=True)
        self.meta = json.loads(json.dumps(meta or {}, default=str))
        self.step: int | None = None  # the step being recorded; None: not recording
        self.tensors: dict[str, list[torch.Tensor]] = {d: [] for d in DIRECTIONS}
        self.saved: list[Path] = []

    @property
    def recording(self) -> bool:
        return self.step is not None

    def start_step(self, step: int) -> None:
        """Record the collectives from now on if ``step`` is chosen; a step left unsaved is dropped."""
        self.step = step if step in self.steps else None
        self.tensors = {d: [] for d in DIRECTIONS}

    def record(self, direction: str, x: torch.Tensor) -> None:
        """This rank's contribution ``x`` to a collective of ``direction`` (copied now: it is reduced in place)."""
        if self.step is None:
            return
        if direction not in self.tensors:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        self.tensors[direction].append(x.detach().to("cpu", copy=True))

    def save(self) -> Path | None:
        """Write the recorded step (atomically) and stop recording; None when nothing was recorded."""
        if self.step is None:
            return None
        payload = {"step": self.step, "rank": self.rank, "meta": self.meta, "tensors": self.tensors}
        buf = io.BytesIO()
        torch.save(payload, buf)
        path = atomic_write_bytes(capture_file(self.folder, self.step, self.rank), buf.getvalue())
        self.saved.append(path)
        self.step = None
        self.tensors = {d: [] for d in DIRECTIONS}
        return path


def load_captures(folder: str | Path) -> list[dict[str, Any]]:
    """Every capture file of ``folder`` (step, rank, meta, tensors), in step then rank order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no capture folder {folder}")
    found = []
    for path in folder.iterdir():
        m = FILE_PATTERN.fullmatch(path.name)
        if m:
            found.append((int(m[1]), int(m[2]), path))
    if not found:
        raise FileNotFoundError(f"no capture files (step<N>-rank<R>.pt) in {folder}")
    out = []
    for step, rank, path in sorted(found):
        payload = torch.load(path, weights_only=True)
        if payload.get("step") != step or payload.get("rank") != rank or set(payload.get("tensors", {})) != set(DIRECTIONS):
            raise ValueError(f"{path} is not a capture file of step {step}, rank {rank}")
        out.append(payload)
    return out
