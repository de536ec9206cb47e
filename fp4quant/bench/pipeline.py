"""The codec work of one rank in a W-rank two-shot all-reduce, timed stage by stage on one device.

    python -m fp4quant.bench.pipeline [--device cpu|cuda] [--worlds 2,4,8] [--sizes 8M,16M,...]
        [--dtypes float32,bfloat16] [--presets fp4quant] [--out pipeline_<device>.csv] [--quick]

A two-shot all-reduce of a tensor of N values on W ranks (fp4quant.comm.algorithms.two_shot)
runs, on every rank, three codec stages around two exchanges:

  quantize    the tensor as W rows of S values (S: plan.shard_values, whole blocks), one
              message per rank                                  -> all-to-all
  reduce      dequantize_reduce of the W messages of this rank's shard (one from each rank),
              summed and re-quantized as one message             -> all-gather
  dequantize  the W reduced shards back into the tensor (in place, as the collective does)

Here the three stages run back to back on one device with no communication: the messages
"received" are the ones this rank produced, which have the sizes and the work of the real
ones.  That is what a performance model needs from a GPU for the codec's share of a step at
W = 2, 4, 8 (fp4quant.perfmodel), and what one GPU can measure: the exchanges themselves need
the GPUs and links of a node.

Each case (W, input size in bytes of its dtype, dtype, preset) is timed over repeated runs
after a warm-up (CUDA: events between the stages, one synchronization per run; CPU: the
clock): the median seconds of each stage, their sum (`sum_s`) and the median of the whole
run from the first stage's start to the last one's end (`total_s`), beside a copy of the
tensor into a prefaulted buffer timed in the same runs (`copy_s`).  GB/s is input bytes per second of the
whole pipeline; `bytes_moved` counts what its stages read and write (input and output once
each, every message written once and read once or twice), and `fraction_of_limit` is the
time the copy's bandwidth would need for those bytes over the measured total.

Writes a CSV with provenance columns and <out>.meta.json (fp4quant.provenance).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from .. import ops
from ..comm import plan
from ..format.config import PRESETS, QuantConfig
from ..format.packed import layout
from ..provenance import atomic_write_csv, atomic_write_json, provenance

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
WORLDS = [2, 4, 8]
SIZES = [8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB]
CPU_SIZES = [1 * MiB, 8 * MiB]
QUICK_SIZES = [256 * KiB, 1 * MiB]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STAGES = ("quantize", "reduce", "dequantize")


def parse_size(token: str) -> int:
    """'256K', '8M', '1G' or a number of bytes -> bytes."""
    token = token.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KiB, "M": MiB, "G": GiB}.get(token[-1:], 1)
    number = token[:-1] if token[-1:] in "KMG" else token
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"cannot read {token!r} as a size (e.g. 256K, 8M, 1G)") from None
    if value <= 0:
        raise ValueError(f"a size must be positive, got {token!r}")
    return value


def int_list(spec: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} wants integers separated by commas, got {spec!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what} wants positive integers separated by commas, got {spec!r}")
    return values


class Clock:
    """Marks between the stages of one run: CUDA events (one synchronization at the end of the
    run) or the CPU's clock."""

    def __init__(self, device: torch.device, marks: int):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)]
        self.times = [0.0] * marks

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks."""
        if self.cuda:
            self.events[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]
        return [b - a for a, b in zip(self.times, self.times[1:])]


def measure_case(device: torch.device, world: int, size: int, dtype: torch.dtype, preset: str, min_time: float,
                 max_iters: int) -> dict:
    """One rank's codec stages of a two-shot all-reduce of `size` bytes of `dtype` on `world` ranks."""
    config = QuantConfig.preset(preset)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = size // itemsize
    shard = plan.shard_values(numel, world, config.block)
    # the padded tensor (the collective pads a tensor that is no whole number of blocks per rank)
    x = torch.zeros(world * shard, device=device, dtype=dtype)
    x[:numel].normal_()
    out = torch.empty_like(x)
    out.copy_(x)  # prefaulted: the decode writes into the tensor, as the collective does
    rows, dest = x.view(world, shard), out.view(world, shard)

    def run(clock: Clock) -> None:
        clock.mark(0)
        msgs = ops.quantize_rows(rows, config)  # (W, m): one message per rank
        clock.mark(1)
        mine = ops.dequantize_reduce(msgs, shard, config, dtype, requantize=True)  # this rank's shard, summed
        clock.mark(2)
        # the W reduced shards (here: the W messages of the first stage, which have their size)
        ops.dequantize_rows(msgs, shard, config, dtype, saturate=False, out=dest)
        clock.mark(3)
        del mine
        out.copy_(x)  # the copy of the same bytes, timed in the same run
        clock.mark(4)

    run(Clock(device, 5))  # warm-up: first launches, workspace allocations
    runs: list[list[float]] = []
    while len(runs) < 5 or (sum(r[-1] for r in runs) < min_time and len(runs) < max_iters):
        clock = Clock(device, 5)
        run(clock)
        q, r, d, c = clock.seconds()
        runs.append([q, r, d, c, q + r + d])
    med = [statistics.median(col) for col in zip(*runs)]
    total = statistics.median(r[4] for r in runs)
    message = layout(shard, config).nbytes
    # input read + W messages written; W messages read + one written; W messages read + output written
    moved = itemsize * numel + world * message + (world + 1) * message + world * message + itemsize * numel
    copy_bw = 2 * size / med[3]
    return {
        "world": world, "size_bytes": size, "numel": numel, "dtype": str(dtype).removeprefix("torch."),
        "preset": preset, "shard_values": shard, "message_bytes": message, "iters": len(runs),
        "quantize_s": med[0], "reduce_s": med[1], "dequantize_s": med[2], "sum_s": med[0] + med[1] + med[2],
        "total_s": total, "copy_s": med[3], "gbps": size / total / 1e9, "copy_gbps": size / med[3] / 1e9,
        "quantize_gbps": size / med[0] / 1e9, "reduce_gbps": size / med[1] / 1e9,
        "dequantize_gbps": size / med[2] / 1e9, "bytes_moved": moved,
        "fraction_of_limit": moved / copy_bw / total,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None, help="CSV path (default data/pipeline_<device>.csv)")
    ap.add_argument("--worlds", default=None, help="ranks W of the two-shot (default 2,4,8; --quick: 2,4)")
    ap.add_argument("--sizes", default=None,
                    help="input sizes, bytes of the input dtype: 256K,8M,1G (default 8M..256M on CUDA, 1M,8M on a CPU)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="input dtypes (default float32,bfloat16)")
    ap.add_argument("--presets", default="fp4quant", help="compressed presets (default fp4quant)")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds of timed runs per case (at least 5 runs)")
    ap.add_argument("--max-iters", type=int, default=20, help="most timed runs per case")
    ap.add_argument("--quick", action="store_true", help="small sizes, W = 2 and 4, few runs (a smoke test)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no GPU")
    try:
        worlds = int_list(args.worlds or ("2,4" if args.quick else ",".join(map(str, WORLDS))), "--worlds")
        if args.sizes:
            sizes = [parse_size(t) for t in args.sizes.split(",") if t.strip()]
        else:
            sizes = QUICK_SIZES if args.quick else SIZES if device.type == "cuda" else CPU_SIZES
        names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        if not names or any(d not in DTYPES for d in names):
            raise ValueError(f"--dtypes wants some of {', '.join(DTYPES)}, got {args.dtypes!r}")
        presets = [p.strip() for p in args.presets.split(",") if p.strip()]
        bad = [p for p in presets if p not in PRESETS or not QuantConfig.preset(p).compressed]
        if not presets or bad:
            raise ValueError(f"--presets wants compressed presets, got {args.presets!r}")
    except ValueError as exc:
        ap.error(str(exc))
    out = args.out or f"data/pipeline_{device.type}.csv"
    min_time, max_iters = (0.0, 5) if args.quick else (args.min_time, max(5, args.max_iters))
    prov = provenance(device, backend=ops.backend(device), worlds=worlds, sizes=sizes, dtypes=names, presets=presets,
                      stages=list(STAGES), what="one rank's codec stages of a W-rank two-shot all-reduce, "
                                              "no communication (fp4quant.bench.pipeline)")
    rows = []
    for preset in presets:
        for name in names:
            for world in worlds:
                for size in sizes:
                    row = measure_case(device, world, size, DTYPES[name], preset, min_time, max_iters)
                    rows.append(row)
                    print(f"W={world} {size / MiB:g} MiB {name} {preset}: quantize {row['quantize_s'] * 1e3:.3f} ms, "
                          f"reduce {row['reduce_s'] * 1e3:.3f} ms, dequantize {row['dequantize_s'] * 1e3:.3f} ms, "
                          f"total {row['total_s'] * 1e3:.3f} ms = {row['gbps']:.1f} GB/s "
                          f"(copy {row['copy_gbps']:.1f} GB/s)", file=sys.stderr)
    for r in rows:
        r.update(device=device.type, backend=prov["backend"], hardware=prov["hardware"], torch=prov["torch"],
                 commit=prov["commit"])
    atomic_write_csv(out, rows)
    atomic_write_json(out + ".meta.json", prov)
    print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
