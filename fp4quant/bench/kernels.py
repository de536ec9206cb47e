"""Throughput of the codec kernels, with the memory-bandwidth ceiling and the ecosystem's peer beside them.

    python -m fp4quant.bench.kernels [--device cpu|cuda] [--out data/kernels_cpu.csv] [--quick]

For input sizes 64 KiB .. 256 MiB (bytes of the float32 input), in one run:
  quantize, dequantize and dequantize_reduce (2 messages summed and re-quantized, as in a
  two-shot all-reduce of 2 ranks) of every compressed preset, on the native kernels;
  torch.clone of the input (the copy-bandwidth ceiling); the pure-PyTorch reference
  quantize (up to --reference-max-mib); torchao's NVFP4 quantization (to_nvfp4 with a
  per-tensor scale computed outside the timed region).
GB/s is bytes of input processed per second (for dequantize: of the float32 values it
produces; for dequantize_reduce: of the values it sums).  Each figure is the median of
repeated timed runs after a warm-up (CUDA: events).  Rows carry the hardware and versions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from tqdm import tqdm

from .. import ops
from ..format.config import PRESETS, QuantConfig
from ..provenance import atomic_write_csv, atomic_write_json, provenance

MiB = 1 << 20
SIZES = [64 << 10, 256 << 10, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [64 << 10, 1 * MiB]
PRESETS_MEASURED = [p for p in PRESETS if p != "bf16"]


def timer(device: torch.device, fn: Callable[[], object], min_time: float, max_iters: int) -> tuple[float, int]:
    """Median seconds per call of fn, after one warm-up call."""
    fn()
    times: list[float] = []
    total = 0.0
    while len(times) < 3 or (total < min_time and len(times) < max_iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
        times.append(t)
        total += t
    return statistics.median(times), len(times)


def torchao_nvfp4():
    """torchao's NVFP4 quantization, or None when torchao cannot be imported."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except Exception:  # noqa: BLE001  (torchao is an optional peer)
        return None

    def quantize(x2d: torch.Tensor, per_tensor_scale: torch.Tensor):
        return NVFP4Tensor.to_nvfp4(x2d, per_tensor_scale=per_tensor_scale)

    return quantize


def measure(device: torch.device, sizes: list[int], presets: list[str], min_time: float, reference_max: int) -> list[dict]:
    rows: list[dict] = []
    nvfp4 = torchao_nvfp4()
    steps = len(sizes) * (3 + 3 * len(presets))
    bar = tqdm(total=steps, desc="kernels", unit="case", file=sys.stderr)

    def record(op: str, impl: str, preset: str, size: int, seconds: float, iters: int, processed: int) -> None:
        rows.append({
            "op": op, "impl": impl, "preset": preset, "size_bytes": size, "numel": size // 4,
            "seconds": seconds, "gbps": processed / seconds / 1e9, "iters": iters,
        })

    for size in sizes:
        numel = size // 4
        x = torch.randn(numel, device=device)
        max_iters = 50 if size <= 16 * MiB else 7
        t, k = timer(device, lambda: x.clone(), min_time, max_iters)
        record("clone", "torch", "", size, t, k, size)
        bar.update()
        if size <= reference_max:
            ref_cfg = QuantConfig.preset("fp4quant")
            from ..reference import codec as reference

            t, k = timer(device, lambda: reference.quantize_rows(x[None], ref_cfg), min_time, 3)
            record("quantize", "reference", "fp4quant", size, t, k, size)
        bar.update()
        if nvfp4 is not None:
            x2d = x.view(-1, 4096) if numel % 4096 == 0 else x.view(1, -1)
            scale = x.abs().amax() / 2688  # given, not timed: the kindest setting for the peer
            t, k = timer(device, lambda: nvfp4(x2d, scale), min_time, max_iters)
            record("quantize", "torchao", "nvfp4", size, t, k, size)
        bar.update()
        for name in presets:
            config = QuantConfig.preset(name)
            t, k = timer(device, lambda: ops.quantize_rows(x[None], config), min_time, max_iters)
            record("quantize", ops.backend(device), name, size, t, k, size)
            bar.update()
            msg = ops.quantize_rows(x[None], config)
            t, k = timer(device, lambda: ops.dequantize_rows(msg, numel, config, torch.float32), min_time, max_iters)
            record("dequantize", ops.backend(device), name, size, t, k, size)
            bar.update()
            two = torch.cat([msg, msg])
            t, k = timer(device, lambda: ops.dequantize_reduce(two, numel, config, torch.float32, True), min_time, max_iters)
            record("dequantize_reduce", ops.backend(device), name, size, t, k, 2 * size)
            bar.update()
    bar.close()
    return rows


def summary(rows: list[dict], size: int = 64 * MiB) -> dict:
    """The issue's targets at one size: fp4quant quantize against torchao, the reference and clone."""
    def gbps(op, impl, preset):
        for r in rows:
            if (r["op"], r["impl"], r["preset"], r["size_bytes"]) == (op, impl, preset, size):
                return r["gbps"]
        return None

    ours = gbps("quantize", "native", "fp4quant")
    out = {"size_bytes": size, "fp4quant_quantize_gbps": ours}
    for key, other in (("torchao_nvfp4", gbps("quantize", "torchao", "nvfp4")),
                       ("reference", gbps("quantize", "reference", "fp4quant")),
                       ("clone", gbps("clone", "torch", ""))):
        out[f"{key}_gbps"] = other
        out[f"fp4quant_over_{key}"] = ours / other if ours and other else None
    warp, naive = gbps("quantize", "native", "fp4quant"), gbps("quantize", "native", "naive_pack")
    out["warp_over_naive_packing"] = warp / naive if warp and naive else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None, help="CSV path (default data/kernels_<device>.csv)")
    ap.add_argument("--quick", action="store_true", help="two small sizes, fewer presets (a smoke test)")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of timed runs per case (at least 3 runs)")
    ap.add_argument("--reference-max-mib", type=int, default=64, help="largest size the slow reference is timed at")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no GPU")
    out = args.out or f"data/kernels_{device.type}.csv"
    sizes = QUICK_SIZES if args.quick else SIZES
    presets = ["fp4quant", "naive_pack", "nvfp4"] if args.quick else PRESETS_MEASURED
    prov = provenance(device, threads=torch.get_num_threads(), backend=ops.backend(device), sizes=sizes)
    rows = measure(device, sizes, presets, 0.05 if args.quick else args.min_time, args.reference_max_mib * MiB)
    for r in rows:
        r.update(device=device.type, hardware=prov["hardware"], threads=prov["threads"], torch=prov["torch"],
                 commit=prov["commit"])
    atomic_write_csv(out, rows)
    prov["summary"] = summary(rows, min(64 * MiB, max(sizes)))
    atomic_write_json(out + ".meta.json", prov)
    print(f"wrote {len(rows)} rows to {out}", file=sys.stderr)
    for key, value in prov["summary"].items():
        print(f"  {key}: {value:.3g}" if isinstance(value, float) else f"  {key}: {value}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
