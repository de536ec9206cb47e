"""Rank bodies of tests/comm/test_dilation.py (run by tests/distributed.py's run_ranks): every
sleep of the dilation is recorded instead of slept, so the tests count them, never time them."""

from __future__ import annotations

import torch
import torch.distributed as dist

import fp4quant.comm as comm
from fp4quant.comm import dilation as dilation_module
from fp4quant.parallel import CommConfig, TPCommunicator

LATENCY = 0.5  # never slept: the recorded sleeps are counted in units of it


def _recording() -> list[float]:
    slept: list[float] = []
    dilation_module.Dilation.sleep = staticmethod(slept.append)
    return slept


def _steps(slept: list[float]) -> int:
    return round(sum(slept) / LATENCY)


def _inp(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + rank))


def latency_steps(rank: int, world: int) -> dict:
    """(sleeps, steps) each collective slept with a latency dilation, and with none."""
    slept = _recording()
    d = comm.Dilation(latency_s=LATENCY)
    n, out = 4 * world * 2048, {}
    cases = {
        "plain_all_reduce": lambda dil: comm.all_reduce(_inp(rank, n), None, dilation=dil),
        "cast_all_reduce": lambda dil: comm.all_reduce(_inp(rank, n), comm.Wire.cast(), dilation=dil),
        "two_shot": lambda dil: comm.all_reduce(_inp(rank, n), "fp4quant", dilation=dil, chunk_bytes=None),
        "two_shot_4_chunks": lambda dil: comm.all_reduce(_inp(rank, n), "fp4quant", dilation=dil,
                                                         chunk_bytes=n * 4 // 4),
        "one_shot": lambda dil: comm.all_reduce(_inp(rank, n), "fp4quant", algorithm="one_shot", dilation=dil),
        "plain_all_gather": lambda dil: comm.all_gather(torch.empty(world * n), _inp(rank, n), None, dilation=dil),
        "all_gather": lambda dil: comm.all_gather(torch.empty(world * n), _inp(rank, n), "fp4quant", dilation=dil),
        "plain_reduce_scatter": lambda dil: comm.reduce_scatter(torch.empty(n), _inp(rank, world * n), None,
                                                                dilation=dil),
        "reduce_scatter": lambda dil: comm.reduce_scatter(torch.empty(n), _inp(rank, world * n), "fp4quant",
                                                          dilation=dil),
        "exact_of_communicator": lambda dil: TPCommunicator(dist.group.WORLD, CommConfig(dilation=dil))
        .all_reduce_exact(_inp(rank, 8)),
    }
    for name, fn in cases.items():
        for label, dil in (("dilated", d), ("default", None)):
            slept.clear()
            comm.reset_stats()
            fn(dil)
            stats = comm.stats().get("other", {})
            out[f"{name}/{label}"] = {"sleeps": len(slept), "steps": _steps(slept), "wire_steps": stats.get("wire_steps")}
    return out


def codec_stretch(rank: int, world: int) -> dict:
    """Codec sleeps under a slow and a fast dilated codec; the results, with and without dilation."""
    slept = _recording()
    n, out = 4 * world * 2048, {}
    plain = _inp(rank, n)
    comm.all_reduce(plain, "fp4quant", stats_key="none")
    for label, bps in (("slow", 1e3), ("fast", 1e18)):
        slept.clear()
        comm.reset_stats()
        x = _inp(rank, n)
        comm.all_reduce(x, "fp4quant", dilation=comm.Dilation(codec_bytes_per_s=bps), stats_key="s")
        s = comm.stats()["s"]
        out[label] = {"sleeps": slept[:], "stretch_s": s["codec_stretch_s"], "unstretched": s["codec_unstretched"],
                      "quantize_s": s["quantize_s"], "wire_steps": s["wire_steps"],
                      "same_bits": bool(torch.equal(x.view(torch.int32), plain.view(torch.int32)))}
    return out
