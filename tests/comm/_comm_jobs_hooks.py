"""Rank body of tests/comm/test_hooks.py: a two-shot all-reduce with a recording hook installed."""

from __future__ import annotations

import torch

import fp4quant.comm as comm


class Recording:
    def __init__(self):
        self.wire, self.codec = [], []

    def on_wire(self, steps, intra_node):
        self.wire.append(steps)

    def on_codec(self, op, seconds, values, message_bytes):
        self.codec.append((op, values, message_bytes))


def told(rank: int, world: int) -> dict:
    x = torch.randn(3 * 4096, generator=torch.Generator().manual_seed(rank))
    plain = x.clone()
    comm.all_reduce(plain, "fp4quant", chunk_bytes=None)
    seen = Recording()
    comm.hooks.install(seen)
    try:
        comm.all_reduce(x, "fp4quant", chunk_bytes=None)
    finally:
        comm.hooks.remove()
    return {"same_bits": bool(torch.equal(x.view(torch.int32), plain.view(torch.int32))), "wire": seen.wire,
            "codec_ops": [c[0] for c in seen.codec], "values": [c[1] for c in seen.codec]}
