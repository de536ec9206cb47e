"""Rank bodies of tests/cluster/test_dilation.py (run by tests/distributed.py's run_ranks): the
dilation is installed as the collectives' hooks, and every sleep is recorded instead of slept,
so the tests count them, never time them."""

from __future__ import annotations

import torch
import torch.distributed as dist

import fp4quant.comm as comm
from fp4quant.cluster import dilation as dilation_module
from fp4quant.cluster.dilation import Dilation
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
    """(sleeps, steps) each collective slept with a latency dilation installed, and with none."""
    slept = _recording()
    n, out = 4 * world * 2048, {}
    cases = {
        "plain_all_reduce": lambda: comm.all_reduce(_inp(rank, n), None),
        "cast_all_reduce": lambda: comm.all_reduce(_inp(rank, n), comm.Wire.cast()),
        "two_shot": lambda: comm.all_reduce(_inp(rank, n), "fp4quant", chunk_bytes=None),
        "two_shot_4_chunks": lambda: comm.all_reduce(_inp(rank, n), "fp4quant", chunk_bytes=n * 4 // 4),
        "one_shot": lambda: comm.all_reduce(_inp(rank, n), "fp4quant", algorithm="one_shot"),
        "plain_all_gather": lambda: comm.all_gather(torch.empty(world * n), _inp(rank, n), None),
        "all_gather": lambda: comm.all_gather(torch.empty(world * n), _inp(rank, n), "fp4quant"),
        "plain_reduce_scatter": lambda: comm.reduce_scatter(torch.empty(n), _inp(rank, world * n), None),
        "reduce_scatter": lambda: comm.reduce_scatter(torch.empty(n), _inp(rank, world * n), "fp4quant"),
        "exact_of_communicator": lambda: TPCommunicator(dist.group.WORLD, CommConfig()).all_reduce_exact(_inp(rank, 8)),
    }
    for name, fn in cases.items():
        for label, dilation in (("dilated", Dilation(latency_s=LATENCY)), ("default", None)):
            slept.clear()
            comm.reset_stats()
            if dilation is not None:
                comm.hooks.install(dilation)
            try:
                fn()
            finally:
                comm.hooks.remove()
            stats = comm.stats()
            wire_steps = sum(s.get("wire_steps", 0) for s in stats.values())
            out[f"{name}/{label}"] = {"sleeps": len(slept), "steps": _steps(slept), "wire_steps": wire_steps}
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
        dilation = Dilation(codec_bytes_per_s=bps)
        comm.hooks.install(dilation)
        try:
            comm.all_reduce(x, "fp4quant", stats_key="s")
        finally:
            comm.hooks.remove()
        s = comm.stats()["s"]
        out[label] = {"sleeps": slept[:], "stretch_s": dilation.slept["codec_stretch_s"],
                      "unstretched": dilation.slept["codec_unstretched"], "quantize_s": s["quantize_s"],
                      "wire_steps": s["wire_steps"],
                      "same_bits": bool(torch.equal(x.view(torch.int32), plain.view(torch.int32)))}
    return out
