"""What Quartet's pseudo-quantized FP4 GEMMs cost against exact ones, side by side.

    python -m fp4quant.bench.quartet_gemm [--out data/compute_cpu.csv] [--tokens 256] [--repeats 15]

One linear layer's forward and backward (y = x W^T, then dL/dx and dL/dW), exact
(F.linear) and Quartet (fp4quant.reference.quartet: quantize -> dequantize -> float32
GEMM), at the shapes of one TP rank's layers of a model preset, timed alternately in one
process (exact, quartet, exact, ...) on the threads torch is given.  Rows: layer, impl,
min/median/max seconds over the repeats, and the median slowdown over exact.  This
measures the cost of emulating FP4 numerics where no FP4 GEMM exists (CPUs, H100): it is
not, and says nothing about, the speed of FP4 tensor cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from ..provenance import atomic_write_csv, atomic_write_json, provenance
from ..reference.quartet import quartet_linear

# (name, in_features, out_features) of one TP rank's block linears: tiny (hidden 256,
# intermediate 704, 8 heads of 32, 4 KV heads) at TP=2 -- the trainer's default model
TINY_TP2 = (("q_proj", 256, 128), ("k_proj", 256, 64), ("v_proj", 256, 64), ("o_proj", 128, 256),
            ("gate_proj", 256, 352), ("up_proj", 256, 352), ("down_proj", 352, 256))


def step(impl: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, seed: int) -> float:
    """Seconds of one forward and backward of ``impl``."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    t0 = time.perf_counter()
    y = F.linear(x, w) if impl == "exact" else quartet_linear(x, w, None, seed)
    y.backward(g)
    return time.perf_counter() - t0


def measure(tokens: int, repeats: int, layers=TINY_TP2) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, fan_in, fan_out in layers:
        x = torch.randn(tokens, fan_in, generator=gen)
        w = torch.randn(fan_out, fan_in, generator=gen) / fan_in**0.5
        g = torch.randn(tokens, fan_out, generator=gen)
        times: dict[str, list[float]] = {"exact": [], "quartet": []}
        for impl in times:  # warm-up
            step(impl, x, w, g, 0)
        for r in range(repeats):  # alternating, so that drifts of a shared machine hit both alike
            for impl in times:
                times[impl].append(step(impl, x, w, g, r))
        base = statistics.median(times["exact"])
        for impl, t in times.items():
            rows.append({"layer": name, "tokens": tokens, "in_features": fan_in, "out_features": fan_out,
                         "impl": impl, "threads": torch.get_num_threads(), "repeats": repeats,
                         "min_s": min(t), "median_s": statistics.median(t), "max_s": max(t),
                         "slowdown_vs_exact": statistics.median(t) / base})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.bench.quartet_gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/compute_cpu.csv")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per step (the default run: seq 128 x batch 2)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a TP rank under torchrun has one)")
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.repeats < 1 or a.threads < 1:
        ap.error("--tokens, --repeats and --threads must be >= 1")
    torch.set_num_threads(a.threads)
    rows = measure(a.tokens, a.repeats)
    prov = provenance(tokens=a.tokens, repeats=a.repeats, threads=a.threads, kind="measured")
    for r in rows:
        r.update(hardware=prov["hardware"], torch=prov["torch"], commit=prov["commit"])
    atomic_write_csv(a.out, rows)
    atomic_write_json(a.out + ".meta.json", prov)
    exact = sum(r["median_s"] for r in rows if r["impl"] == "exact")
    quartet = sum(r["median_s"] for r in rows if r["impl"] == "quartet")
    print(f"one TP rank's block linears, forward + backward: exact {1e3 * exact:.1f} ms, quartet {1e3 * quartet:.1f} ms "
          f"({quartet / exact:.1f}x) -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
