"""Measure, on the ranks a training run will use, what the step model needs: run under the
same launcher as the run (``python -m fp4quant.cluster run ... -- -m fp4quant.perfmodel.probe``).

    python -m fp4quant.cluster run --rate-mbit 50 -- -m fp4quant.perfmodel.probe \
        --model tiny --seq-len 128 --batch-size 2 --presets fp4quant --out probe.json

Why not the calibration's figures alone (fp4quant.cluster.calibrate): it times one process
while the other core idles, the codec on one (1, N) message with round-to-nearest, and no
link.  A training step of W ranks on the emulated nodes differs in each:

compute  every rank computes its shard at once, sharing the cores and memory: each rank
         here times its own shard's training step (world 1, as the calibration does) while
         the other ranks do the same, twice: back to back ("rank_flops_continuous", as the
         calibration) and paced, each step after an idle gap as long as itself, as a run's
         compute comes between waits on the link ("rank_flops": what the model uses; on a
         shared machine the scheduler favours a task that slept over the busy ones); the
         model's FLOP/s is the ranks' mean step's, and "skew_s" (the mean over steps of the
         slowest rank's step less the ranks' mean) the wait of a rank for a slower peer
codec    the two-shot all-reduce quantizes (W, N/W) rows, dequantize-reduces W messages of
         N/W values into one shard (re-quantizing it) and dequantizes W shards; backward
         traffic uses stochastic rounding ("<preset>:sr"), which costs more.  Timed twice:
         each op alone in a loop at exactly those shapes ("codec_hot_values_per_s"), and
         inside real compressed all-reduces (fp4quant.comm.all_reduce, its quantize /
         dequantize timers) with --evict-mib of memory touched before each, as the compute
         between a step's all-reduces does ("codec_values_per_s": what the model uses; the
         hot loop's ratio splits the decoding time between dequantize-reduce and dequantize)
exact    the trainer's uncompressed scalar all-reduces (vocab-parallel cross-entropy, gradient
         norm, the non-finite check): timed as 8-byte all-reduces over the link
link     uncompressed all-reduces of --link-sizes bytes (BF16), for model.fit_link

Rank 0 writes ``--out`` (JSON): medians, every rank's compute FLOP/s, raw link timings.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm, ops
from ..cluster.calibrate import measure_training_flops, rank_step_seconds
from ..format.config import QuantConfig
from ..models.config import ModelConfig
from ..provenance import atomic_write_json, provenance
from ..comm import RandomStreams
from ..threads import pin_threads

LINK_SIZES = (4096, 65536, 1 << 20, 2 << 20, 4 << 20)


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call allocation and dispatch
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def skew_seconds(per_rank: list[list[float]]) -> float:
    """Mean over steps of (the slowest rank's step - the ranks' mean step): how long, per
    step, a rank waits for a slower peer inside the collectives (in lockstep ranks, the step
    lasts as long as its slowest rank)."""
    steps = list(zip(*per_rank))
    return statistics.fmean(max(s) - statistics.fmean(s) for s in steps)


def codec_seconds(values: int, world: int, config: QuantConfig, repeats: int = 30) -> dict[str, float]:
    """Seconds per call of each op of one two-shot all-reduce of ``values`` float32 values
    on ``world`` ranks, at the shapes fp4quant.comm.algorithms.two_shot uses."""
    shard = -(-values // world)
    x = torch.randn(world, shard)
    msgs = ops.quantize_rows(x, config, 1, 0)
    reduced = ops.dequantize_reduce(msgs, shard, config, torch.float32, requantize=True, seed=1, offset=0)
    gathered = reduced.repeat(world).view(world, -1)
    return {
        "quantize": _median_s(lambda: ops.quantize_rows(x, config, 1, 0), repeats),
        "dequantize_reduce": _median_s(lambda: ops.dequantize_reduce(msgs, shard, config, torch.float32,
                                                                     requantize=True, seed=1, offset=0), repeats),
        "dequantize": _median_s(lambda: ops.dequantize_rows(gathered, shard, config, torch.float32, saturate=False),
                                repeats),
    }


def codec_rates(values: int, world: int, presets: list[str], repeats: int = 30) -> dict[str, dict[str, float]]:
    """values/s of each op (over the all-reduce's ``values``) per preset, round-to-nearest
    under the preset's name and stochastic rounding under "<preset>:sr"."""
    out: dict[str, dict[str, float]] = {}
    for name in presets:
        config = QuantConfig.preset(name)
        if not config.compressed:
            continue
        for key, cfg in ((name, config), (f"{name}:sr", config.replace(rounding="stochastic"))):
            out[key] = {op: values / s for op, s in codec_seconds(values, world, cfg, repeats).items()}
    return out


def in_collective_rates(values: int, presets: list[str], hot: dict[str, dict[str, float]], iters: int = 20,
                        evict_mib: int = 32) -> dict[str, dict[str, float]]:
    """values/s of each op inside compressed all-reduces of ``values`` float32 values, with
    ``evict_mib`` MiB touched before each call (caches as cold as after a layer's compute)."""
    evict = torch.zeros(max(evict_mib, 1) << 18)
    out: dict[str, dict[str, float]] = {}
    for key, rates in hot.items():
        name, _, sr = key.partition(":")
        config = QuantConfig.preset(name).replace(rounding="stochastic") if sr else QuantConfig.preset(name)
        streams = RandomStreams(1) if sr else None
        x = torch.randn(values)
        comm.all_reduce(x.clone(), config, algorithm="two_shot", stats_key="probe", streams=streams)  # warm-up
        comm.reset_stats()
        for _ in range(iters):
            evict.add_(1.0)
            comm.all_reduce(x.clone(), config, algorithm="two_shot", stats_key="probe", streams=streams)
        st = comm.stats()["probe"]
        q, dq = st["quantize_s"] / iters, st["dequantize_s"] / iters
        # the hot loop's ratio of the two decoding ops splits the measured decoding time
        t_dqr, t_dq = 1 / rates["dequantize_reduce"], 1 / rates["dequantize"]
        out[key] = {"quantize": values / q, "dequantize_reduce": values / (dq * t_dqr / (t_dqr + t_dq)),
                    "dequantize": values / (dq * t_dq / (t_dqr + t_dq))}
    return out


def link_timings(sizes: list[int], iters: int, budget_bytes: int) -> list[dict]:
    """Median (slowest rank's) seconds of uncompressed BF16 all-reduces of ``sizes`` bytes."""
    rows = []
    for size in sizes:
        t = torch.zeros(max(size // 2, 1), dtype=torch.bfloat16)
        n = max(3, min(iters, budget_bytes // max(size, 1)))
        dist.all_reduce(t)
        times = []
        for _ in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        lat = slowest.tolist()
        rows.append({"size_bytes": size, "iters": n, "latency_s": statistics.median(lat),
                     "latency_min_s": min(lat), "latency_max_s": max(lat)})
    return rows


def exact_allreduce_s(iters: int = 30) -> float:
    """Median seconds of the trainer's scalar all-reduces (one float64) over the group."""
    t = torch.zeros(1, dtype=torch.float64)
    return _median_s(lambda: dist.all_reduce(t), iters)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--presets", nargs="+", default=["fp4quant"])
    ap.add_argument("--link-sizes", type=int, nargs="*", default=list(LINK_SIZES), help="bytes (BF16 all-reduces)")
    ap.add_argument("--link-iters", type=int, default=5)
    ap.add_argument("--link-budget-mib", type=int, default=16, help="bytes timed per size (at least 3 iterations)")
    ap.add_argument("--evict-mib", type=int, default=32, help="memory touched before each in-collective codec call")
    ap.add_argument("--steps", type=int, default=8, help="timed training steps of each compute probe")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.link_iters < 1 or a.steps < 1 or any(s < 2 for s in a.link_sizes):
        ap.error("--link-iters and --steps must be >= 1, --link-sizes >= 2 bytes")
    pin_threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig.preset(a.model)
    values = cfg.hidden_size * a.seq_len * a.batch_size
    threads = torch.get_num_threads()
    dist.barrier()  # every rank computes at once, as in the run
    continuous = measure_training_flops(a.model, a.seq_len, a.batch_size, world, threads=threads, steps=a.steps)
    dist.barrier()
    paced = rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps, paced=True)
    dist.barrier()
    flops = cfg.flops_per_token(a.seq_len) * a.seq_len * a.batch_size / world / statistics.fmean(paced)
    hot = codec_rates(values, world, a.presets)
    codec = in_collective_rates(values, a.presets, hot, evict_mib=a.evict_mib)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank_flops": flops, "paced_s": paced, "continuous": continuous, "codec": codec, "hot": hot,
                                      "load": os.getloadavg()[0]})
    exact = exact_allreduce_s()
    link = link_timings(a.link_sizes, a.link_iters, a.link_budget_mib << 20)
    if rank == 0:
        # the step waits for its slowest rank: the smallest FLOP/s and codec rates
        codec_min = {k: {op: min(g["codec"][k][op] for g in gathered) for op in ops_} for k, ops_ in codec.items()}
        hot_min = {k: {op: min(g["hot"][k][op] for g in gathered) for op in ops_} for k, ops_ in hot.items()}
        atomic_write_json(a.out, {
            # the model's rank: the ranks' mean step; their imbalance is the skew
            "rank_flops": cfg.flops_per_token(a.seq_len) * a.seq_len * a.batch_size / world
            / statistics.fmean(t for g in gathered for t in g["paced_s"]),
            "rank_flops_per_rank": [g["rank_flops"] for g in gathered],
            "skew_s": skew_seconds([g["paced_s"] for g in gathered]),
            "paced_step_s": [g["paced_s"] for g in gathered],
            "rank_flops_continuous": min(g["continuous"] for g in gathered), "load_average_1min": gathered[0]["load"],
            "codec_values_per_s": codec_min, "codec_hot_values_per_s": hot_min, "message_values": values, "world": world, "threads_per_rank": threads,
            "exact_allreduce_s": exact, "link": link,
            **provenance(model=a.model, seq_len=a.seq_len, batch_size=a.batch_size, argv=sys.argv[1:] if argv is None else argv),
        })
        print(f"probe: {min(g['rank_flops'] for g in gathered) / 1e9:.1f} GFLOP/s on the slowest rank, scalar all-reduce "
              f"{exact * 1e3:.2f} ms -> {a.out}", file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
