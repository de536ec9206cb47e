"""Measure, on the ranks a training run will use, what the step model needs (run under the
run's own launcher):

    python -m fp4quant.cluster run --rate-mbit 50 -- -m fp4quant.perfmodel.probe \
        --model tiny --seq-len 128 --batch-size 2 --presets fp4quant --out probe.json

Why not the calibration's figures alone (fp4quant.cluster.calibrate): it times one process
alone, the codec on one message and no link, while a run's ranks share the machine and meet
the codec and the link inside their steps.  So every rank here, at once, times per comm (BF16
and each preset: "compute_by_comm") its shard's training step cut by idle gaps where the run's
all-reduces are (calibrate.CollectiveGaps): FLOP/s, skew, the scalar all-reduces, the codec on
the tensors the run sends (backward under "<preset>:sr") and a small transfer ending each gap
(the latency per wire step); then steps with the run's own all-reduces of --collective-fraction
of each tensor (calibrate.InStepCollectives).  A full probe also times the link (uncompressed
all-reduces of a small message, the run's messages and 2, 4 and 8 times the largest, since a
shaped link's rate per byte drifts with the size; --link-sizes overrides) and the codec alone
and in real all-reduces.  Rank 0 writes ``--out`` (JSON).

``--gaps-from EARLIER.json`` makes a bracketing probe after the runs: the gapped steps alone,
with EARLIER's link timings for their waits, so that perfmodel.model_validation averages the
per-step inputs over both sides of the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm, ops
from ..cluster.calibrate import measure_training_flops, rank_step_seconds
from ..format.config import QuantConfig
from ..models.model_config import ModelConfig
from ..parallel import CommConfig
from ..provenance import atomic_write_json, provenance
from ..comm import RandomStreams
from ..threads import pin_threads
from .model import Workload, allreduce_time, fit_alpha_beta

# the trainer's a step, as the model counts them (the compute probe issues exactly these)
SCALAR_ALLREDUCES_PER_STEP = next(f.default for f in dataclasses.fields(Workload) if f.name == "scalar_allreduces")

LATENCY_MESSAGE_BYTES = 4096  # the smallest all-reduce timed: its bytes ride on the token bucket's burst


def workload_link_sizes(values: int, presets: list[str]) -> list[int]:
    """Bytes of the uncompressed all-reduces that time the link for a run whose messages carry
    ``values`` values under ``presets`` (see the module doc)."""
    messages = {2 * values} | {math.ceil(values * QuantConfig.preset(p).bits_per_value / 8)
                               for p in presets if QuantConfig.preset(p).compressed}
    largest = max(messages)
    return sorted({LATENCY_MESSAGE_BYTES, *messages, 2 * largest, 4 * largest, 8 * largest})


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
    decoded = torch.empty(world, shard)  # the all-reduce decodes into its own tensor
    return {
        "quantize": _median_s(lambda: ops.quantize_rows(x, config, 1, 0), repeats),
        "dequantize_reduce": _median_s(lambda: ops.dequantize_reduce(msgs, shard, config, torch.float32,
                                                                     requantize=True, seed=1, offset=0), repeats),
        "dequantize": _median_s(lambda: ops.dequantize_rows(gathered, shard, config, torch.float32, saturate=False,
                                                            out=decoded), repeats),
    }


def shard_or_values(op: str, values: int, world: int) -> float:
    """The values an op's rate counts (see codec_rates)."""
    return -(-values // world) if op == "dequantize_reduce" else values


def codec_rates(values: int, world: int, presets: list[str], repeats: int = 30) -> dict[str, dict[str, float]]:
    """values/s of each op per preset, round-to-nearest under the preset's name and stochastic
    rounding under "<preset>:sr": of the all-reduce's ``values`` for quantize and dequantize,
    of the shard's (``values / world``, what it writes) for dequantize_reduce, as the model
    (model.step) and the other codec figures (calibrate.measure_codec, the kernel benchmark)
    count them."""
    out: dict[str, dict[str, float]] = {}
    for name in presets:
        config = QuantConfig.preset(name)
        if not config.compressed:
            continue
        for key, cfg in ((name, config), (f"{name}:sr", config.replace(rounding="stochastic"))):
            out[key] = {op: shard_or_values(op, values, world) / s for op, s in codec_seconds(values, world, cfg, repeats).items()}
    return out


def in_collective_rates(values: int, world: int, presets: list[str], hot: dict[str, dict[str, float]],
                        iters: int = 40, evict_mib: int = 32) -> dict[str, dict[str, float]]:
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
        quant, dequant = [], []
        for _ in range(iters):
            evict.add_(1.0)
            comm.reset_stats()
            comm.all_reduce(x.clone(), config, algorithm="two_shot", stats_key="probe", streams=streams)
            st = comm.stats()["probe"]
            quant.append(st["quantize_s"])
            dequant.append(st["dequantize_s"])
        q, dq = statistics.fmean(quant), statistics.fmean(dequant)  # means, as the trainer's records
        # the hot loop's ratio of the two decoding ops splits the measured decoding time
        out[key] = {"quantize": values / q, **split_decoding(dq, rates, values, world)}
    return out


def split_decoding(decode_s: float, rates: dict[str, float], values: int, world: int) -> dict[str, float]:
    """values/s of dequantize-reduce and dequantize (counted as codec_rates counts them) from
    ``decode_s``, the seconds a call of both together (fp4quant.comm times them as one), split
    as their seconds a call at ``rates`` divide."""
    shard = shard_or_values("dequantize_reduce", values, world)
    t_reduce, t_dequantize = shard / rates["dequantize_reduce"], values / rates["dequantize"]
    share = t_reduce / (t_reduce + t_dequantize)
    return {"dequantize_reduce": shard / (decode_s * share), "dequantize": values / (decode_s * (1 - share))}


def in_step_codec_rates(preset: str, per_rank: list[list[dict]], values: int, world: int) -> dict[str, dict[str, float]]:
    """values/s of each codec op as the gapped compute steps timed it (calibrate.CollectiveGaps
    with a codec; ``per_rank``: each rank's steps, each {direction: {op: seconds, "calls": n}}):
    the mean over ranks and steps of the seconds a call, forward under ``preset`` (round to
    nearest), backward under "<preset>:sr", counted as codec_rates counts them.  The mean, not
    the slowest rank: the trainer's codec timers are rank 0's, a wait for a slower rank shows
    as skew."""
    out: dict[str, dict[str, float]] = {}
    for direction, key in (("fwd", preset), ("bwd", f"{preset}:sr")):
        records = [s[direction] for steps in per_rank for s in steps if s[direction]["calls"]]
        if not records:
            continue
        calls = sum(r["calls"] for r in records)
        out[key] = {op: shard_or_values(op, values, world) * calls / sum(r[op] for r in records)
                    for op in ("quantize", "dequantize_reduce", "dequantize")}
    return out


def collective_codec_rates(preset: str, per_rank: list[list[dict]], values: int, world: int,
                           split: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """values/s of each codec op inside the run's own all-reduces of whole tensors in the
    probe's steps (calibrate.InStepCollectives; ``per_rank``: each rank's steps, each
    {direction: {"quantize", "decode": seconds, "calls"}}), counted as in_step_codec_rates;
    the decoding seconds (dequantize-reduce and dequantize, timed as one) split between the two
    ops as their seconds a call in ``split`` (the gapped steps' in-step rates) divide."""
    out: dict[str, dict[str, float]] = {}
    for direction, key in (("fwd", preset), ("bwd", f"{preset}:sr")):
        records = [s[direction] for steps in per_rank for s in steps if s[direction]["calls"]]
        if not records or key not in split:
            continue
        calls = sum(r["calls"] for r in records)
        decode = sum(r["decode"] for r in records) / calls  # seconds a call
        out[key] = {"quantize": values * calls / sum(r["quantize"] for r in records),
                    **split_decoding(decode, split[key], values, world)}
    return out


def _least_per_step(per_rank: list[list[dict]]) -> list[tuple[float, int]]:
    """Per step, (the least over the ranks of its transfers' seconds, its wire steps)."""
    if not per_rank or not per_rank[0]:
        return []
    if len({len(steps) for steps in per_rank}) != 1:
        raise ValueError(f"the ranks timed different numbers of steps: {[len(s) for s in per_rank]}")
    return [(min(steps[i]["seconds"] for steps in per_rank), per_rank[0][i]["wire_steps"])
            for i in range(len(per_rank[0]))]


def in_step_latency(per_rank: list[list[dict]]) -> float | None:
    """Seconds a wire step of the small transfers that end the gapped steps' waits took
    (calibrate.CollectiveGaps with latency_bytes; ``per_rank``: each rank's steps, each
    {"seconds", "wire_steps"}): per step the least over the ranks, as the trainer counts a
    step's communication (the later rank's time is the link's, the earlier's also its wait
    for the peer), summed over the steps, over their wire steps.  None without transfers."""
    steps = _least_per_step(per_rank)
    wire_steps = sum(n for _, n in steps)
    return sum(least for least, _ in steps) / wire_steps if wire_steps else None


def in_step_latency_by_step(per_rank: list[list[dict]]) -> list[float | None]:
    """in_step_latency of each step alone (None for a step without wire steps): its spread
    within one probe, against which a drift between probes can be told apart."""
    return [least / n if n else None for least, n in _least_per_step(per_rank)]


def link_timings(sizes: list[int], iters: int, budget_bytes: int, latency_iters: int = 100) -> list[dict]:
    """Median and mean (slowest rank's) seconds of uncompressed BF16 all-reduces of ``sizes``
    bytes; ``latency_iters`` of those no larger than LATENCY_MESSAGE_BYTES (their time is
    spread wide: 0.3-5 ms from p10 to p90 on the emulated link, so their mean, which a run's
    many all-reduces add up to, needs many)."""
    rows = []
    for size in sizes:
        t = torch.zeros(max(size // 2, 1), dtype=torch.bfloat16)
        n = latency_iters if size <= LATENCY_MESSAGE_BYTES else max(3, min(iters, budget_bytes // max(size, 1)))
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
                     "latency_mean_s": statistics.fmean(lat), "latency_min_s": min(lat), "latency_max_s": max(lat)})
    return rows


def collective_gaps(link: list[dict], values: int, world: int, presets: list[str]) -> dict[str, float]:
    """Seconds a rank waits in each of the run's all-reduces of ``values`` values, per comm
    ("bf16" and each compressed preset): the link's alpha-beta fit (no token-bucket credit)
    at the message's bytes.  The compute probe idles that long where each all-reduce is."""
    if world == 1:  # nothing is sent: no waits
        return {"bf16": 0.0, **{p: 0.0 for p in presets if QuantConfig.preset(p).compressed}}
    alpha, bw = fit_alpha_beta([r["size_bytes"] for r in link], [r["latency_s"] for r in link], world)
    out = {"bf16": allreduce_time(2 * values, world, bw, alpha)}
    for p in presets:
        config = QuantConfig.preset(p)
        if config.compressed:
            out[p] = allreduce_time(values * config.bits_per_value / 8, world, bw, alpha)
    return out


def exact_allreduce_s(iters: int = 30) -> float:
    """Median seconds of the trainer's scalar all-reduces (one float64) over the group."""
    t = torch.zeros(1, dtype=torch.float64)
    return _median_s(lambda: dist.all_reduce(t), iters)


def read_earlier(path: str, world: int, values: int, comms: set[str]) -> dict:
    """The probe a bracketing probe follows (--gaps-from), checked against this one's shape."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--gaps-from {path}: {exc}") from None
    if "link" not in earlier:
        raise ValueError(f"--gaps-from {path}: not a full probe (no link timings; a bracketing probe's gaps come from one)")
    if earlier["world"] != world or earlier["message_values"] != values:
        raise ValueError(f"--gaps-from {path}: it probed {earlier['world']} ranks and {earlier['message_values']}-value "
                         f"messages, this probe {world} and {values} (model, --seq-len or --batch-size differ)")
    if set(earlier.get("compute_by_comm", {})) != comms:
        raise ValueError(f"--gaps-from {path}: it timed comms {sorted(earlier.get('compute_by_comm', {}))}, "
                         f"this probe {sorted(comms)} (--presets differ)")
    return earlier


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--presets", nargs="+", default=["fp4quant"])
    ap.add_argument("--link-sizes", type=int, nargs="*", default=None,
                    help="bytes (BF16 all-reduces); default: the run's messages and multiples (see above)")
    ap.add_argument("--link-iters", type=int, default=20)
    ap.add_argument("--link-budget-mib", type=int, default=16, help="bytes timed per size (at least 3 iterations)")
    ap.add_argument("--evict-mib", type=int, default=32, help="memory touched before each in-collective codec call")
    ap.add_argument("--steps", type=int, default=8, help="timed training steps of each compute probe")
    ap.add_argument("--collective-fraction", type=float, default=0.5,
                    help="share of each run tensor the in-step collectives all-reduce (0: none)")
    ap.add_argument("--gaps-from", metavar="EARLIER_JSON", default=None,
                    help="a bracketing probe after the runs: the gapped steps alone, with this probe's link (see above)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.link_iters < 1 or a.steps < 1 or any(s < 2 for s in a.link_sizes or []):
        ap.error("--link-iters and --steps must be >= 1, --link-sizes >= 2 bytes")
    if not 0 <= a.collective_fraction <= 1:
        ap.error(f"--collective-fraction must be in [0, 1], got {a.collective_fraction}")
    pin_threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig.preset(a.model)
    values = cfg.hidden_size * a.seq_len * a.batch_size
    threads = torch.get_num_threads()
    comms = {"bf16", *(p for p in a.presets if QuantConfig.preset(p).compressed)}
    try:
        earlier = read_earlier(a.gaps_from, world, values, comms) if a.gaps_from else None
    except ValueError as exc:
        dist.destroy_process_group()
        print(f"fp4quant.perfmodel.probe: error: {exc}", file=sys.stderr)
        return 2
    dist.barrier()  # every rank computes at once, as in the run
    if earlier is None:
        continuous = measure_training_flops(a.model, a.seq_len, a.batch_size, world, threads=threads, steps=a.steps)
        dist.barrier()
        link_sizes = a.link_sizes or workload_link_sizes(values, a.presets)
        link = link_timings(link_sizes, a.link_iters, a.link_budget_mib << 20)
    else:  # the same waits as the probe it brackets
        continuous, link = None, earlier["link"]
    gaps = collective_gaps(link, values, world, a.presets)
    dist.barrier()
    step_flops = cfg.flops_per_token(a.seq_len) * a.seq_len * a.batch_size / world
    gapped, scalar, in_step, transfers, collectives, collective_codec = {}, {}, {}, {}, {}, {}
    for comm_name, gap in gaps.items():  # the run's compute cut by its all-reduces' waits (and codec)
        scalar[comm_name], in_step[comm_name], transfers[comm_name] = [], [], []
        codec_config = CommConfig.from_preset(comm_name) if QuantConfig.preset(comm_name).compressed and world > 1 else None
        gapped[comm_name] = rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps,
                                              collective_gap_s=gap, scalar_allreduce_s=scalar[comm_name],
                                              codec=codec_config, codec_s=in_step[comm_name],
                                              latency_bytes=LATENCY_MESSAGE_BYTES,
                                              transfers=transfers[comm_name])
        dist.barrier()
        if world > 1 and a.collective_fraction > 0:  # the run's own all-reduces of part of its tensors
            collectives[comm_name] = []
            rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps,
                              in_step_collectives=CommConfig.from_preset(comm_name),
                              collective_fraction=a.collective_fraction, transfers=collectives[comm_name])
            dist.barrier()
        if codec_config is not None:  # and of whole tensors, for the codec as the run's collectives meet it
            collective_codec[comm_name] = []
            rank_step_seconds(a.model, a.seq_len, a.batch_size, world, a.steps, in_step_collectives=codec_config,
                              codec_s=collective_codec[comm_name])
            dist.barrier()
    hot, codec = {}, {}
    if earlier is None:  # the codec in loops and in all-reduces: a full probe's only
        hot = codec_rates(values, world, a.presets)
        codec = in_collective_rates(values, world, a.presets, hot, evict_mib=a.evict_mib)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"gapped_s": gapped, "scalar_s": scalar, "continuous": continuous, "codec": codec, "hot": hot,
                                      "in_step": in_step, "transfers": transfers, "collectives": collectives,
                                      "collective_codec": collective_codec, "load": os.getloadavg()[0]})
    exact = exact_allreduce_s() if earlier is None else None
    if rank == 0:
        # the step waits for its slowest rank: the smallest codec rates
        codec_min = {k: {op: min(g["codec"][k][op] for g in gathered) for op in ops_} for k, ops_ in codec.items()}
        hot_min = {k: {op: min(g["hot"][k][op] for g in gathered) for op in ops_} for k, ops_ in hot.items()}
        # the model's rank: the ranks' mean step; their imbalance is the skew
        by_comm = {c: {"rank_flops": step_flops / statistics.fmean(t for g in gathered for t in g["gapped_s"][c]),
                       "skew_s": skew_seconds([g["gapped_s"][c] for g in gathered]),
                       "collective_gap_s": gaps[c], "step_s": [g["gapped_s"][c] for g in gathered],
                       # a rank's seconds a step in the five, over the ranks' steps: per all-reduce
                       "scalar_allreduce_s": statistics.fmean(t for g in gathered for t in g["scalar_s"][c])
                       / SCALAR_ALLREDUCES_PER_STEP}
                   for c in gaps}
        for c, entry in by_comm.items():
            rates = in_step_codec_rates(c, [g["in_step"][c] for g in gathered], values, world)
            if rates:
                entry["codec_values_per_s"] = rates
                if c in collective_codec:
                    entry["collective_codec_values_per_s"] = collective_codec_rates(
                        c, [g["collective_codec"][c] for g in gathered], values, world, rates)
                entry["codec_values_per_s_by_rank"] = [in_step_codec_rates(c, [g["in_step"][c]], values, world)
                                                       for g in gathered]
            latency = in_step_latency([g["transfers"][c] for g in gathered])
            if latency is not None:
                entry["wire_step_latency_s"] = latency
                entry["wire_step_latency_s_by_step"] = in_step_latency_by_step([g["transfers"][c] for g in gathered])
            if c in collectives:
                least = _least_per_step([g["collectives"][c] for g in gathered])
                entry["collective_fraction"] = a.collective_fraction
                entry["collective_comm_s"] = statistics.fmean(t for t, _ in least)
                entry["collective_wire_steps"] = statistics.fmean(n for _, n in least)
                entry["collective_comm_s_by_step"] = [t for t, _ in least]
        shared = {"rank_flops": by_comm["bf16"]["rank_flops"], "skew_s": by_comm["bf16"]["skew_s"], "compute_by_comm": by_comm,
                  "load_average_1min": gathered[0]["load"], "message_values": values, "world": world,
                  "threads_per_rank": threads}
        run_info = provenance(model=a.model, seq_len=a.seq_len, batch_size=a.batch_size,
                              argv=sys.argv[1:] if argv is None else argv)
        if earlier is None:
            out = {**shared, "rank_flops_continuous": min(g["continuous"] for g in gathered),
                   "codec_values_per_s": codec_min, "codec_hot_values_per_s": hot_min,
                   "exact_allreduce_s": exact, "link": link, **run_info}
            note = f"scalar all-reduce {exact * 1e3:.2f} ms"
        else:
            out, note = {**shared, "gaps_from": a.gaps_from, **run_info}, f"bracketing {a.gaps_from}"
        atomic_write_json(a.out, out)
        print(f"probe: {by_comm['bf16']['rank_flops'] / 1e9:.1f} GFLOP/s a rank (BF16's gaps), {note} -> {a.out}",
              file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
