"""How fast each of the backend's primitives moves bytes over the link, by message size.

    python -m fp4quant.cluster run --rate-mbit 60 --link-only -- \
        -m fp4quant.bench.transfers --out data/cpu/bench/transfers.csv

The compressed all-reduce (fp4quant.comm.algorithms.two_shot) exchanges its messages with
fp4quant.comm.exchange's all-to-all and all-gather ("exchange_all_to_all",
"exchange_all_gather": on gloo, point-to-point with every receive posted first); an
uncompressed BF16 all-reduce is the backend's own ``all_reduce`` (gloo: a ring that pipelines
its chunks).  On a shaped link the primitives need not reach the same rate: this times each
of them, beside torch's ``all_to_all_single`` and ``all_gather_into_tensor`` and a concurrent
``isend`` / ``irecv`` pair to every peer posted sends first (on gloo these let the two
directions of the link take turns: see fp4quant.comm.exchange), at sizes given as the bytes
each rank sends, and reports the rate per rank (sent bytes / seconds).  Each timed call
follows a barrier; the slowest rank's time counts.

Rows: primitive, size_bytes (asked), sent_bytes (what each rank sends), iters, latency_s (median) with min and max,
MBps_per_rank (sent bytes / median seconds), world_size, backend, provenance.  Rank 0
writes ``--out`` (CSV, atomically) and ``--out``.meta.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..comm import exchange
from ..provenance import atomic_write_csv, atomic_write_json, provenance

SIZES = (65536, 262144, 1 << 20, 4 << 20)
PRIMITIVES = ("all_reduce", "exchange_all_to_all", "exchange_all_gather", "all_to_all_single",
              "all_gather_into_tensor", "isend_irecv")


def primitive_call(primitive: str, sent_bytes: int, rank: int, world: int) -> tuple[Callable[[], None], int]:
    """A call of ``primitive`` in which each rank sends about ``sent_bytes`` over the group, and
    the bytes it does send (an even count per peer; the ring's share of whole BF16 values)."""
    per_peer = max(2, sent_bytes // max(world - 1, 1) // 2 * 2)
    if primitive == "all_reduce":  # a ring all-reduce of N bytes sends 2 (W-1)/W N per rank
        values = max(world, sent_bytes * world // (2 * max(world - 1, 1)) // 2)
        t = torch.zeros(values, dtype=torch.bfloat16)
        return (lambda: dist.all_reduce(t)), 2 * (world - 1) * 2 * values // world
    if primitive in ("exchange_all_to_all", "all_to_all_single"):  # W chunks, W-1 of them leave
        src = torch.zeros(world * per_peer, dtype=torch.uint8)
        dst = torch.empty_like(src)
        fn = exchange.all_to_all if primitive == "exchange_all_to_all" else dist.all_to_all_single
        return (lambda: fn(dst, src)), (world - 1) * per_peer
    if primitive in ("exchange_all_gather", "all_gather_into_tensor"):  # the shard goes to each of W-1 peers
        shard = torch.zeros(per_peer, dtype=torch.uint8)
        out = torch.empty(world * per_peer, dtype=torch.uint8)
        fn = exchange.all_gather if primitive == "exchange_all_gather" else dist.all_gather_into_tensor
        return (lambda: fn(out, shard)), (world - 1) * per_peer
    if primitive == "isend_irecv":  # every pair at once, sends posted first, both before waiting
        src = torch.zeros(world * per_peer, dtype=torch.uint8)
        dst = torch.empty_like(src)
        peers = [p for p in range(world) if p != rank]

        def pairs() -> None:
            reqs = [dist.isend(src[p * per_peer:(p + 1) * per_peer], p) for p in peers]
            reqs += [dist.irecv(dst[p * per_peer:(p + 1) * per_peer], p) for p in peers]
            for q in reqs:
                q.wait()
        return pairs, (world - 1) * per_peer
    raise ValueError(f"unknown primitive {primitive!r}; known: {', '.join(PRIMITIVES)}")


def time_calls(fn: Callable[[], None], iters: int) -> list[float]:
    """Seconds of ``iters`` calls, each after a barrier, the slowest rank's (one warm-up call)."""
    fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes each rank sends per call")
    ap.add_argument("--primitives", nargs="+", default=list(PRIMITIVES), choices=PRIMITIVES)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default="data/cpu/bench/transfers.csv")
    a = ap.parse_args(argv)
    if a.iters < 1 or any(s < 2 for s in a.sizes):
        ap.error("--iters must be >= 1 and --sizes >= 2 bytes")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        print(f"fp4quant.bench.transfers: error: needs at least 2 ranks (got world size {world})", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    rows = []
    for size in a.sizes:
        for primitive in a.primitives:
            fn, sent = primitive_call(primitive, size, rank, world)
            times = time_calls(fn, a.iters)
            median = statistics.median(times)
            rows.append({"primitive": primitive, "size_bytes": size, "sent_bytes": sent, "iters": a.iters,
                         "latency_s": median, "latency_min_s": min(times), "latency_max_s": max(times),
                         "MBps_per_rank": sent / median / 1e6, "world_size": world, "backend": dist.get_backend()})
            if rank == 0:
                print(f"{primitive:>24} {sent:>10} B: {1e3 * median:9.2f} ms ({min(times) * 1e3:.2f}-{max(times) * 1e3:.2f}),"
                      f" {sent / median / 1e6:6.2f} MB/s per rank", file=sys.stderr, flush=True)
    if rank == 0:
        prov = provenance(sizes=a.sizes, iters=a.iters, argv=sys.argv[1:] if argv is None else argv)
        for r in rows:
            r.update(hardware=prov["hardware"], torch=prov["torch"], commit=prov["commit"])
        atomic_write_csv(a.out, rows)
        atomic_write_json(a.out + ".meta.json", prov)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
