"""The collectives every rank runs, as a function of (rank, group): run by real gloo ranks
(tests/distributed.py) and by threads of one process (fp4quant.comm.local), to compare bits."""

from __future__ import annotations

import torch

import fp4quant.comm as comm
from fp4quant.format.config import QuantConfig


def sequence(rank: int, world: int, group=None) -> dict:
    sr = QuantConfig.preset("fp4quant", rounding="stochastic")
    out = {}
    x = torch.randn(5000, generator=torch.Generator().manual_seed(rank))
    streams = comm.RandomStreams(7)
    for name, kw in (("two_shot", dict(config="fp4quant")), ("one_shot", dict(config="fp4quant", algorithm="one_shot")),
                     ("sr", dict(config=sr, streams=streams)), ("exact", dict(config=None)),
                     ("chunked", dict(config=sr, streams=streams, chunk_bytes=4096)),
                     ("hierarchical", dict(config="fp4quant", algorithm="hierarchical", ranks_per_node=2))):
        if name == "hierarchical" and world % 2:
            continue
        y = x.clone()
        comm.all_reduce(y, group=group, validate=True, **kw)
        out[name] = y
    g = torch.empty(world * 3000)
    comm.all_gather(g, x[:3000], "fp4quant", group=group)
    out["all_gather"] = g
    r = torch.empty(1000)
    comm.reduce_scatter(r, x[: world * 1000], "fp4quant", group=group)
    out["reduce_scatter"] = r
    return out


def real(rank: int, world: int) -> dict:
    return sequence(rank, world)
