"""Bodies of the multi-rank capture tests (run by distributed.run_ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fp4quant.parallel import CommConfig, TPCommunicator, TrafficCapture


def reduce_and_capture(rank, world, folder, preset="exact"):
    """Three steps of one forward and two backward all-reduces, steps 0 and 2 captured: what
    each rank sent, what it got back, and the files its capture saved."""
    capture = TrafficCapture(folder, steps=(0, 2), rank=rank, meta={"model": "test"})
    tp = TPCommunicator(dist.group.WORLD, CommConfig.from_preset(preset), capture=capture)
    sent, got = [], []
    for step in range(3):
        tp.start_step(step)
        gen = torch.Generator().manual_seed(100 * step + rank)
        xs = {"fwd": [torch.randn(4, 64, generator=gen)], "bwd": [torch.randn(4, 64, generator=gen) for _ in range(2)]}
        sent.append({d: [x.clone() for x in v] for d, v in xs.items()})
        got.append({d: [tp.all_reduce(x, d) for x in v] for d, v in xs.items()})
        capture.save()
    return {"sent": sent, "got": got, "saved": [str(p) for p in capture.saved]}
