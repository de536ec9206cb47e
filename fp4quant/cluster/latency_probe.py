"""The emulated cluster's measured latency: a small all-reduce timed inside it, with and without
the latency the ranks inject (fp4quant.cluster.dilation), before the job runs.

    torchrun ... -m fp4quant.cluster.latency_probe --out probe.json   (the cluster runner starts it)

Rank 0 writes ``{"bytes", "iterations", "steps", "plain": {...}, "dilated": {...}}``, each with
the median, min and max seconds of the all-reduces (each iteration as long as its slowest
rank), and the dilation the ranks were given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from .. import comm
from ..provenance import atomic_write_json
from .rank import dilation_from_env

PROBE_BYTES = 4096
PROBE_ITERATIONS = 7


def time_all_reduce(x: torch.Tensor, iterations: int, warmup: int = 2) -> dict:
    """Median, min and max seconds of ``iterations`` uncompressed all-reduces of ``x`` (under
    whatever collective hooks are installed)."""
    times = []
    for i in range(warmup + iterations):
        dist.barrier()
        t = time.perf_counter()
        comm.all_reduce(x, None, stats_key="probe")
        if i >= warmup:
            times.append(time.perf_counter() - t)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    t = slowest.tolist()
    return {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.cluster.latency_probe", description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bytes", type=int, default=PROBE_BYTES)
    ap.add_argument("--iterations", type=int, default=PROBE_ITERATIONS)
    a = ap.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        dilation = dilation_from_env()
        x = torch.ones(max(1, a.bytes // 4))
        world = dist.get_world_size()
        plain = time_all_reduce(x, a.iterations)
        comm.reset_stats()
        comm.hooks.install(dilation)
        try:
            dilated = time_all_reduce(x, a.iterations, warmup=0)
        finally:
            comm.hooks.remove()
        steps = comm.stats()["probe"]["wire_steps"]  # of the dilated series: each had its latency slept
        if dist.get_rank() == 0:
            atomic_write_json(a.out, {
                "bytes": 4 * x.numel(), "iterations": a.iterations, "world": world,
                "wire_steps_per_all_reduce": 2 * (world - 1), "wire_steps_slept": steps,
                "dilation": dilation.to_dict(), "plain": plain, "dilated": dilated,
                "added_s": dilated["median_s"] - plain["median_s"],
                "expected_added_s": 2 * (world - 1) * dilation.latency_s,
            })
        dist.barrier()  # no rank tears its connections down while another still uses them
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: torch's gloo threads sometimes abort it after the work is done
