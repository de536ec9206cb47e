"""Rank bodies of tests/comm/test_hierarchical.py (tests/distributed.py's run_ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import fp4quant.comm as comm
from fp4quant.format.config import QuantConfig


def _inp(rank: int, n: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 + rank)).to(dtype)


def _gathered(x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def sums(rank: int, world: int, n: int = 50_000, ranks_per_node: int | None = 2) -> dict:
    """Exact and compressed hierarchical sums against the float64 sum and the flat two-shot;
    every variant's bits on every rank; refusals."""
    exact_sum = sum(_inp(r, n).double() for r in range(world))
    out: dict = {}

    def run(name, x, **kw):
        comm.all_reduce(x, kw.pop("config", "fp4quant"), algorithm=kw.pop("algorithm", "hierarchical"),
                        ranks_per_node=ranks_per_node, stats_key=name, **kw)
        same = all(torch.equal(_bits(x), _bits(o)) for o in _gathered(x))
        err = float(((x.double() - exact_sum) ** 2).sum() / (exact_sum ** 2).sum())
        out[name] = {"same_on_every_rank": same, "nmse": err}
        return x

    run("exact", _inp(rank, n), config=None)
    base = run("hier", _inp(rank, n), chunk_bytes=None)
    run("flat", _inp(rank, n), algorithm="two_shot", chunk_bytes=None)
    fwd = run("hier_forwarded", _inp(rank, n), chunk_bytes=None, intra_wire="compressed")
    chunked = run("hier_chunked", _inp(rank, n), chunk_bytes=16384)
    out["forwarding_same_bits"] = bool(torch.equal(_bits(fwd), _bits(base)))
    out["chunking_same_bits"] = bool(torch.equal(_bits(chunked), _bits(base)))
    sr = QuantConfig.preset("fp4quant", rounding="stochastic")
    one = run("sr", _inp(rank, n), config=sr, chunk_bytes=None, streams=comm.RandomStreams(5))
    many = run("sr_chunked", _inp(rank, n), config=sr, chunk_bytes=16384, streams=comm.RandomStreams(5))
    out["stochastic_chunking_same_bits"] = bool(torch.equal(_bits(one), _bits(many)))
    bf = run("bf16", _inp(rank, n, torch.bfloat16), chunk_bytes=None)
    out["bf16_dtype"] = str(bf.dtype)
    run("bf16_exact", _inp(rank, n, torch.bfloat16), config=None)
    out["stats"] = {k: comm.stats()[k]["bytes_sent"] for k in ("hier", "flat", "exact")}
    return out


def refusals(rank: int, world: int) -> dict:
    out = {}
    for name, kw in (("uneven", dict(ranks_per_node=3)), ("max", dict(ranks_per_node=2, op="max")),
                     ("intra_wire", dict(ranks_per_node=2, intra_wire="nvlink"))):
        try:
            comm.all_reduce(_inp(rank, 100), "fp4quant", algorithm="hierarchical", validate=True, **kw)
            out[name] = None
        except (ValueError, TypeError) as exc:
            out[name] = str(exc)
    x = _inp(rank, 100)
    comm.all_reduce(x, "fp4quant")  # still in step
    out["in_step"] = all(torch.equal(x, o) for o in _gathered(x))
    return out
