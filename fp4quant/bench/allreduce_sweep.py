"""Latency and bandwidth of the compressed all-reduce against the uncompressed one.

    torchrun --standalone --nproc-per-node 2 -m fp4quant.bench.allreduce_sweep \
        [--out data/collectives.csv] [--sizes 4096 65536 ...] [--iters 10] [--quick]

Sizes are the bytes of each rank's input tensor (float32, or --dtype bfloat16; 4 KiB .. 256 MiB by default,
x4 apart).  Series: the uncompressed all-reduce (``config=none``: torch.distributed's
all_reduce on the backend), and every compressed preset x algorithm (one_shot,
two_shot), unchunked and chunked (``chunk_bytes``; at sizes of at least two chunks),
plus a chunk-size sweep of fp4quant two-shot.  Per series and size: median latency over
the timed iterations (the slowest rank's time of each iteration, a barrier before
each; one warmup below 64 MiB; fewer iterations at large sizes, ``--budget-mib`` of
input per series and size), algorithm bandwidth (input bytes / latency), bus bandwidth (x 2 (W-1)/W,
the nccl-tests convention), bytes each rank put on the wire (fp4quant.comm.stats()),
the speedup over the uncompressed all-reduce, and rank 0's split of the time between
the codec and the communication.  Rank 0 writes the CSV atomically after every size
(so an interrupted run keeps what it measured) and ``<out>.meta.json`` (provenance, and
the summary: crossover sizes, speedups at 64 MiB, the auto thresholds derived from
this run, fp4quant.comm.auto.thresholds_from_rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from .. import comm
from ..comm import auto
from ..format.config import QuantConfig
from ..ops import backend as codec_backend
from ..provenance import atomic_write_csv, atomic_write_json, provenance
from ..threads import pin_threads

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = [4 * KIB * 4**k for k in range(9)]  # 4 KiB .. 256 MiB
PRESETS = ("fp4quant", "no_fwht", "single_scale", "nvfp4", "mxfp4", "int4", "fp8")
ALGORITHMS = ("one_shot", "two_shot", "hierarchical")
DEFAULT_ALGORITHMS = ("one_shot", "two_shot")  # hierarchical needs several nodes of several ranks
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB]


@dataclass(frozen=True)
class Series:
    config: str  # preset name or "none"
    algorithm: str  # "uncompressed", "one_shot", "two_shot", "hierarchical"
    chunk_bytes: int | str | None = None  # "auto": all_reduce's default policy
    study: str = "presets"
    overlap: bool = True  # False: chunks one after the other (the control for the overlap)

    @property
    def label(self) -> str:
        if self.chunk_bytes == "auto":
            chunk = "+chunkauto"
        else:
            chunk = f"+chunk{self.chunk_bytes // KIB}K" if self.chunk_bytes else ""
        return f"{self.config}/{self.algorithm}{chunk}{'' if self.overlap else '+sync'}"


def series(presets, algorithms, chunked: int | str | None, sweep: list[int]) -> list[Series]:
    """The uncompressed all-reduce; each preset x algorithm unchunked and with ``chunked``
    ("auto": the default policy); fp4quant two-shot with each ``sweep`` chunk size, with
    and without overlap."""
    out = [Series("none", "uncompressed")]
    if "hierarchical" in algorithms:  # the fair uncompressed hierarchy beside the compressed one
        out.append(Series("none", "hierarchical"))
    for p in presets:
        for a in algorithms:
            out.append(Series(p, a, None))
            if chunked:
                out.append(Series(p, a, chunked, "chunked"))
    if "fp4quant" in presets and "two_shot" in algorithms:
        for c in sweep:
            out += [Series("fp4quant", "two_shot", c, "chunk_sweep", overlap) for overlap in (True, False)]
    return out


def effective_chunk(s: Series, size: int, device: torch.device) -> int | None:
    """Bytes per chunk the series uses at ``size`` (None: one chunk)."""
    c = comm.default_chunk_bytes(size, device.type) if s.chunk_bytes == "auto" else s.chunk_bytes
    return c if c and size >= 2 * c else None


def runs(s: Series, size: int, device: torch.device) -> bool:
    """Fixed-size chunking is measured only where it cuts the message; the policy everywhere."""
    return not isinstance(s.chunk_bytes, int) or effective_chunk(s, size, device) is not None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(s: Series, src: torch.Tensor, work: torch.Tensor, iters: int, warmup: int, group=None,
            validate: bool = False) -> dict:
    """Time ``iters`` all-reduces of ``src`` (copied into ``work`` before each); ``validate``:
    each call validated across ranks first (to time what validation costs).  Under the
    emulated cluster its rank wrapper has installed the dilation (fp4quant.comm.hooks)."""
    config = None if s.config == "none" else QuantConfig.preset(s.config)
    algorithm = "two_shot" if s.algorithm == "uncompressed" else s.algorithm  # (no compression: torch's)

    def once() -> float:
        work.copy_(src)
        _sync(work.device)
        dist.barrier(group)
        t = time.perf_counter()
        comm.all_reduce(work, config, group, algorithm=algorithm, chunk_bytes=s.chunk_bytes, stats_key="bench",
                        overlap=s.overlap, validate=validate)
        _sync(work.device)
        return time.perf_counter() - t

    for _ in range(warmup):
        once()
    comm.reset_stats()
    times = torch.tensor([once() for _ in range(iters)], dtype=torch.float64)
    st = comm.stats()["bench"]
    slowest = times.to(work.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)  # an iteration lasts as long as its slowest rank
    lat = slowest.cpu().tolist()
    return {
        "latency_s": statistics.median(lat),
        "latency_min_s": min(lat),
        "latency_max_s": max(lat),
        "wire_bytes": st["bytes_sent"] // iters,
        "uncompressed_wire_bytes": st["bytes_uncompressed"] // iters,
        "codec_s": st["codec_s"] / iters,
        "quantize_s": st["quantize_s"] / iters,
        "dequantize_s": st["dequantize_s"] / iters,
        "comm_s": st["comm_s"] / iters,
    }


def iterations(size: int, iters: int, budget: int, min_iters: int = 1) -> tuple[int, int]:
    """(timed iterations, warmups) at ``size`` bytes: ``iters`` within the budget, never fewer
    than ``min_iters`` (a spread needs several)."""
    return max(min_iters, min(iters, budget // size)), (1 if size < 64 * MIB else 0)


def summarize(rows: list[dict], chunk_policy: str) -> dict:
    """Per compressed series: the crossover (smallest size from which it beats the
    uncompressed all-reduce at every larger measured size), the sizes where it wins at
    all, its speedup at 64 MiB; and the auto thresholds this run implies."""
    summary: dict = {"crossover_bytes": {}, "win_sizes": {}, "speedup_at_64MiB": {}}
    by_label: dict[str, dict[int, float]] = {}
    for r in rows:
        by_label.setdefault(r["series"], {})[r["size_bytes"]] = r["speedup"]
    for label, sp in by_label.items():
        if label.startswith("none/"):
            continue
        summary["crossover_bytes"][label] = auto.stable_threshold([(size, v > 1) for size, v in sp.items()])
        summary["win_sizes"][label] = sorted(size for size, v in sp.items() if v > 1)
        if 64 * MIB in sp:
            summary["speedup_at_64MiB"][label] = sp[64 * MIB]
    lat = {(r["series"], r["size_bytes"]): r["latency_s"] for r in rows}
    # what chunking (default policy vs one chunk) and overlap (vs the "+sync" control) buy:
    # latency ratios > 1 mean the first is faster
    summary["chunking_gain"] = {
        f"{label}@{size}": lat[(label, size)] / lat[(label + "+chunkauto", size)]
        for (label, size) in lat
        if "+" not in label and (label + "+chunkauto", size) in lat and size >= 16 * MIB
    }
    summary["overlap_gain"] = {
        f"{label}@{size}": lat[(label + "+sync", size)] / lat[(label, size)]
        for (label, size) in lat
        if (label + "+sync", size) in lat
    }
    summary["auto_thresholds"] = {
        f"{b}/{w}": vars(t) for (b, w), t in auto.thresholds_from_rows(rows, chunk_policy=chunk_policy).items()
    }
    return summary


def report(summary: dict) -> str:
    lines = []
    for label in [f"fp4quant/{a}{c}" for c in ("", "+chunkauto") for a in ALGORITHMS]:
        if label not in summary["crossover_bytes"]:
            continue
        cross = summary["crossover_bytes"][label]
        lines.append(
            f"{label}: wins from {cross if cross is not None else 'never'} bytes "
            f"(wins at {summary['win_sizes'][label] or 'no size'}); "
            f"speedup at 64 MiB: {summary['speedup_at_64MiB'].get(label, float('nan')):.3f}"
        )
    for key in ("chunking_gain", "overlap_gain"):
        gains = summary[key]
        if gains:
            better = sum(v > 1 for v in gains.values())
            lines.append(f"{key}: faster in {better} of {len(gains)} (series, size) pairs, "
                         f"median ratio {statistics.median(gains.values()):.2f}")
    lines.append(f"auto thresholds (fp4quant.comm.auto.TABLE): {summary['auto_thresholds']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/collectives.csv")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="input bytes per rank")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="input dtype: bfloat16 compares against a BF16 all-reduce, as BF16 training sends")
    ap.add_argument("--no-chunk-sweep", action="store_true", help="skip the fp4quant chunk-size sweep")
    ap.add_argument("--iters", type=int, default=30, help="timed iterations at small sizes")
    ap.add_argument("--min-iters", type=int, default=1,
                    help="timed iterations at every size, whatever the budget (5: a median with a min-max band)")
    ap.add_argument("--budget-mib", type=int, default=512,
                    help="input MiB timed per series and size (fewer iterations at large sizes)")
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    ap.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS), choices=ALGORITHMS,
                    help="hierarchical: also the uncompressed hierarchy (series none/hierarchical); the node "
                         "layout is torchrun's LOCAL_WORLD_SIZE")
    ap.add_argument("--chunk-bytes", default="auto",
                    help="chunking of the 'chunked' series: 'auto' (all_reduce's default policy), bytes, or 0 (none)")
    ap.add_argument("--chunk-sweep", type=int, nargs="*", default=[1 * MIB, 4 * MIB, 16 * MIB],
                    help="chunk sizes for fp4quant two-shot, each with and without overlap")
    ap.add_argument("--backend", default=None, help="default: nccl with CUDA, else gloo")
    ap.add_argument("--validate", action="store_true",
                    help="validate every collective across ranks (times what validation costs)")
    ap.add_argument("--quick", action="store_true",
                    help="3 small sizes, 2 presets, 2 iterations, 256 KiB sweep (for tests)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or QUICK_SIZES
        args.iters, args.presets, args.chunk_sweep = 2, ["fp4quant", "nvfp4"], [256 * KIB]
    sizes = sorted(args.sizes or DEFAULT_SIZES)
    if not 1 <= args.min_iters <= max(args.iters, 1):
        ap.error(f"--min-iters must be in 1..--iters ({args.iters}), got {args.min_iters}")
    itemsize = getattr(torch, args.dtype).itemsize
    bad = [size for size in sizes if size < itemsize or size % itemsize]
    if bad:  # a zero-element all-reduce times nothing, and a remainder would be dropped unsaid
        ap.error(f"--sizes {bad[0]}: each size must be a positive multiple of {itemsize} bytes ({args.dtype})")
    if args.chunk_bytes != "auto" and not args.chunk_bytes.isdigit():
        ap.error(f"--chunk-bytes wants 'auto', a number of bytes or 0 (no chunking), got {args.chunk_bytes!r}")
    if any(c < 1 for c in args.chunk_sweep):
        ap.error(f"--chunk-sweep sizes must be positive, got {args.chunk_sweep}")
    pin_threads()  # ranks share the cores: no inherited extra threads

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    chunked = "auto" if args.chunk_bytes == "auto" else (int(args.chunk_bytes) or None)
    series_list = series(args.presets, args.algorithms, chunked, [] if args.no_chunk_sweep else args.chunk_sweep)
    dtype = getattr(torch, args.dtype)
    prov = provenance(device, backend=backend, world_size=world, sizes=sizes, iters=args.iters,
                      budget_mib=args.budget_mib, validate=args.validate, threads_per_rank=torch.get_num_threads(),
                      hooks=comm.hooks.describe(), codec_backend=codec_backend(device), argv=sys.argv[1:] if argv is None else argv)
    common = {"backend": backend, "world_size": world, "dtype": args.dtype, "hardware": prov["hardware"],
              "torch": prov["torch"], "commit": prov["commit"], "codec": prov["codec_backend"]}
    rows: list[dict] = []
    todo = [(size, s) for size in sizes for s in series_list if runs(s, size, device)]
    todo_set = set(todo)
    bar = tqdm(total=len(todo), desc=f"collectives x{world}", unit="run", file=sys.stderr, disable=rank != 0)
    for size in sizes:
        numel = size // dtype.itemsize
        src = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(device=device, dtype=dtype)
        work = torch.empty_like(src)
        iters, warmup = iterations(size, args.iters, args.budget_mib * MIB, args.min_iters)
        base = None
        for s in series_list:
            if (size, s) not in todo_set:
                continue
            bar.set_postfix_str(f"{size // KIB} KiB {s.label}")
            m = measure(s, src, work, iters, warmup, validate=args.validate)
            base = m["latency_s"] if (s.config, s.algorithm) == ("none", "uncompressed") else base
            rows.append({
                "study": s.study, "series": s.label, "config": s.config, "algorithm": s.algorithm,
                "chunk_policy": "auto" if s.chunk_bytes == "auto" else ("fixed" if s.chunk_bytes else "none"),
                "chunk_bytes": effective_chunk(s, size, device) or "", "overlap": s.overlap,
                "size_bytes": size, "numel": numel, "iters": iters,
                "latency_s": m["latency_s"], "latency_min_s": m["latency_min_s"], "latency_max_s": m["latency_max_s"],
                "algbw_GBps": size / m["latency_s"] / 1e9,
                "busbw_GBps": size / m["latency_s"] / 1e9 * 2 * (world - 1) / world,
                "wire_bytes": m["wire_bytes"], "uncompressed_wire_bytes": m["uncompressed_wire_bytes"],
                "speedup": base / m["latency_s"], "codec_s_rank0": m["codec_s"],
                "quantize_s_rank0": m["quantize_s"], "dequantize_s_rank0": m["dequantize_s"], "comm_s_rank0": m["comm_s"],
                **common,
            })
            bar.update()
        del src, work
        if rank == 0:
            atomic_write_csv(args.out, rows)
    bar.close()
    if rank == 0:
        summary = summarize(rows, "auto" if chunked == "auto" else "none")
        atomic_write_json(args.out + ".meta.json", {**prov, "summary": summary})
        print(f"wrote {len(rows)} rows to {args.out}\n{report(summary)}", file=sys.stderr)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
