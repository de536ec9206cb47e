"""One codec op called in a loop on one input, for a sampling profiler to attribute its time.

    perf record -o perf.data python scripts/kernel_ab/op_loop.py [--preset fp4quant] [--mib 1]
        [--calls 20000] [--threads 1] [--op quantize|dequantize] [--rounding nearest|stochastic]
    perf report -i perf.data --no-children --sort symbol

Prints the loop's GB/s (of float32 values in or out) when done; the profile also holds the
interpreter's start-up, so call the op often enough for it to dominate.
"""

from __future__ import annotations

import argparse
import time

import torch

from fp4quant import ops
from fp4quant.format import QuantConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="fp4quant")
    parser.add_argument("--mib", type=float, default=1.0, help="MiB of float32 input")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--op", choices=["quantize", "dequantize"], default="quantize")
    parser.add_argument("--rounding", choices=["nearest", "stochastic"], default="nearest")
    args = parser.parse_args()
    if args.mib <= 0 or args.calls < 1 or args.threads < 1:
        parser.error(f"--mib, --calls and --threads must be positive, got {args.mib}, {args.calls}, {args.threads}")
    torch.set_num_threads(args.threads)
    config = QuantConfig.preset(args.preset, rounding=args.rounding)
    x = torch.randn(1, int(args.mib * 2**20) // 4, generator=torch.Generator().manual_seed(0))
    message = ops.quantize_rows(x, config)
    # dequantize writes into a prefaulted buffer (a fresh large output would time its page
    # faults); quantize allocates its message each call, as ops.quantize_rows does
    out = torch.zeros_like(x)

    def call() -> None:
        if args.op == "quantize":
            ops.quantize_rows(x, config)
        else:
            ops.dequantize_rows(message, x.shape[1], config, torch.float32, True, out=out)

    for _ in range(min(20, args.calls)):
        call()
    start = time.perf_counter()
    for _ in range(args.calls):
        call()
    seconds = (time.perf_counter() - start) / args.calls
    print(f"{args.op} {args.preset} ({args.rounding}) {args.mib:g} MiB, {args.threads} thread(s): "
          f"{x.numel() * 4 / seconds / 1e9:.3g} GB/s")


if __name__ == "__main__":
    main()
