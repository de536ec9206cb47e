"""Throughput of the codec kernels against the memory-bound limit measured in the same run.

    python -m fp4quant.bench.kernels [--device cpu|cuda] [--out OUT.csv] [--threads 1,2]
        [--dtypes float32,bfloat16] [--quick]

For each torch thread count (default on a CPU: 1 and all; on CUDA: 1, the thread count does
not touch a kernel's speed there), input dtype (default float32; bfloat16 is what a training
all-reduce carries: `dtype` column) and input size 64 KiB .. 256 MiB (bytes of the input in
its dtype: 256 MiB is 64 Mi float32 or 128 Mi bfloat16 values), in one run:
  a copy into a prefaulted buffer (`out.copy_(x)`: what the memory system sustains) and
  torch.clone (a fresh buffer each call: page-fault bound on CPUs, kept for comparison);
  quantize, dequantize (into the copy's prefaulted buffer, as the all-reduce decodes into its
  own tensor: a fresh 64 MiB output would time the page faults, as the clone does) and
  dequantize_reduce (2 messages summed and re-quantized, as in a two-shot all-reduce of 2
  ranks) of every compressed preset, on the native kernels; the
  pure-PyTorch reference quantize (up to --reference-max-mib); torchao's NVFP4 quantization
  (to_nvfp4 with a per-tensor scale computed outside the timed region; the meta file says
  `torchao: absent` where it cannot be imported, and the rows are missing); a plain cast to
  FP8 (`x.to(torch.float8_e4m3fn)`, op cast_fp8: what any quantization that reads the input
  once and writes a byte per value costs, torch's own kernel).
GB/s is bytes of input processed per second (for dequantize: of the values it produces, in
the input dtype; for dequantize_reduce: of the values it sums), over repeated timed runs after a
warm-up (CUDA: events): the median, and the slowest and fastest run (gbps_min, gbps_max).

The memory-bound limit of an op is the copy's bytes per second (read + write) over the bytes
the op moves per byte it processes: quantize 4 (the input dtype's bytes: 2 for bfloat16) +
message bytes per value, dequantize message + 4, dequantize_reduce W messages + the message
(for a float32 quantize that writes 0.565 bytes per value: copy GB/s * 8 / 4.565).  Each
timed call of an op is paired with a copy timed beside it (which goes first alternating): on
a shared VM the memory's speed moves by tens of percent between minutes while a compute-bound
op's does not, so a limit from copies timed apart swings the fraction with the hour (0.31 and
0.40 for the same kernel two minutes apart).
`fraction` is the median over the pairs of the call's fraction of its copy's limit
(fraction_min, fraction_max: the extreme pairs), `limit_gbps` the limit from the pairs' median
copy; `fraction_best` is the op's fastest run against the fastest copy of the size (the
conservative figure of earlier CSVs).  The copy row holds every paired copy of its size.

A format with one scale for the whole tensor (nvfp4's coarse_scale "tensor") cannot encode a
value before it has read every value: beyond the last-level cache its quantize reads the input
twice, whatever the implementation.  `format_bytes_moved` counts that second read (8 + message
bytes per value; elsewhere the op's bytes_moved), and `format_fraction` is the median against
the limit it gives: how close the kernel is to what its format allows.  For nvfp4 that limit is
4.5625 / 8.5625 = 0.53 of the one-read limit, below the 0.60 a one-read format is held to.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from tqdm import tqdm

from .. import ops
from ..format.config import PRESETS, QuantConfig
from ..format.packed import layout
from ..provenance import atomic_write_csv, atomic_write_json, provenance

MiB = 1 << 20
SIZES = [64 << 10, 256 << 10, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [64 << 10, 1 * MiB]
PRESETS_MEASURED = [p for p in PRESETS if p != "bf16"]
WORLD = 2  # messages summed by dequantize_reduce
# at the summary's size on all threads: the targets (fraction of the memory-bound limit)
TARGETS = {"fp4quant": 0.40, "no_fwht": 0.60, "nvfp4": 0.60}


def call_seconds(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds of one call of fn (CUDA: between events)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired_timer(device: torch.device, fn: Callable[[], object], copy: Callable[[], object], min_time: float,
                 max_iters: int) -> tuple[list[float], list[float]]:
    """Seconds of each timed call of fn and of a call of `copy` beside it (at least 5 pairs, which
    goes first alternating), after one warm-up call of each: the two calls of a pair meet the
    same memory system, whose speed on a shared machine moves by tens of percent from one
    minute to the next (a limit from copies timed minutes apart made a dequantize 1.25 of it)."""
    fn()
    copy()
    times: list[float] = []
    copies: list[float] = []
    while len(times) < 5 or (sum(times) < min_time and len(times) < max_iters):
        first_fn = len(times) % 2 == 0
        if first_fn:
            times.append(call_seconds(device, fn))
        copies.append(call_seconds(device, copy))
        if not first_fn:
            times.append(call_seconds(device, fn))
    return times, copies


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


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bytes_moved(op: str, numel: int, message: int, tensor_scale: bool = False, itemsize: int = 4) -> int:
    """Bytes an op reads and writes for numel values of `itemsize` bytes (float32: 4, bfloat16:
    2) whose message has `message` bytes; `tensor_scale`: a quantize that must read its input
    twice (the format's floor, see above)."""
    if op == "quantize" and tensor_scale:
        return 2 * itemsize * numel + message
    if op in ("quantize", "dequantize"):
        return itemsize * numel + message
    if op == "dequantize_reduce":
        return (WORLD + 1) * message
    if op == "cast_fp8":
        return itemsize * numel + numel
    return 2 * itemsize * numel  # copy, clone


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measure_size(device, size: int, threads: int, presets: list[str], min_time: float, reference_max: int,
                 nvfp4, bar, dtype: torch.dtype = torch.float32) -> list[dict]:
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = size // itemsize
    x = torch.randn(numel, device=device, dtype=dtype)
    max_iters = 50 if size <= 16 * MiB else 9
    rows: list[dict] = []

    def timing_row(op, impl, preset, times, processed, moved):
        t = sorted(times)
        return {"op": op, "impl": impl, "preset": preset, "dtype": dtype_name(dtype), "size_bytes": size,
                "numel": numel, "threads": threads,
                "seconds": statistics.median(t), "gbps": processed / statistics.median(t) / 1e9,
                "gbps_min": processed / t[-1] / 1e9, "gbps_max": processed / t[0] / 1e9, "iters": len(t),
                "bytes_moved": moved, "format_bytes_moved": moved}

    def record(op, impl, preset, timed: tuple[list[float], list[float]], processed, moved, format_moved=None):
        times, copies = timed
        row = timing_row(op, impl, preset, times, processed, moved)
        # each call against the copy beside it: the fraction of the limit the op reached then
        pairs = sorted(c * moved / (2 * size * s) for s, c in zip(times, copies))
        row.update(limit_gbps=2 * size / statistics.median(copies) * processed / moved / 1e9,
                   fraction=statistics.median(pairs), fraction_min=pairs[0], fraction_max=pairs[-1])
        if format_moved is not None:
            row["format_bytes_moved"] = format_moved
        row["format_fraction"] = row["fraction"] * row["format_bytes_moved"] / moved
        rows.append(row)
        all_copies.extend(copies)
        bar.update()

    out = torch.empty_like(x)
    out.copy_(x)  # prefault: the copy measures memory, not the kernel's page-zeroing
    all_copies: list[float] = []

    def paired(fn, iters=max_iters):
        return paired_timer(device, fn, lambda: out.copy_(x), min_time, iters)

    record("clone", "torch", "", paired(lambda: x.clone()), size, bytes_moved("clone", numel, 0, itemsize=itemsize))
    # torch's own cast to FP8: one read of the input, one byte written per value
    record("cast_fp8", "torch", "e4m3fn", paired(lambda: x.to(torch.float8_e4m3fn)), size,
           bytes_moved("cast_fp8", numel, 0, itemsize=itemsize))
    fp4_message = layout(numel, QuantConfig.preset("fp4quant")).nbytes
    if size <= reference_max:
        from ..reference import codec as reference

        cfg = QuantConfig.preset("fp4quant")
        record("quantize", "reference", "fp4quant", paired(lambda: reference.quantize_rows(x[None], cfg), 3),
               size, bytes_moved("quantize", numel, fp4_message, itemsize=itemsize))
    if nvfp4 is not None:
        x2d = x.view(-1, 4096) if numel % 4096 == 0 else x.view(1, -1)
        scale = x.abs().amax().float() / 2688  # given, not timed: the kindest setting for the peer
        message = layout(numel, QuantConfig.preset("nvfp4")).nbytes
        record("quantize", "torchao", "nvfp4", paired(lambda: nvfp4(x2d, scale)), size,
               bytes_moved("quantize", numel, message, itemsize=itemsize),
               bytes_moved("quantize", numel, message, True, itemsize))
    backend = ops.backend(device)
    for name in presets:
        config = QuantConfig.preset(name)
        msg = ops.quantize_rows(x[None], config)
        message = msg.numel()
        record("quantize", backend, name, paired(lambda: ops.quantize_rows(x[None], config)),
               size, bytes_moved("quantize", numel, message, itemsize=itemsize),
               bytes_moved("quantize", numel, message, config.coarse_scale == "tensor", itemsize))
        record("dequantize", backend, name,
               paired(lambda: ops.dequantize_rows(msg, numel, config, dtype, out=out[None])),
               size, bytes_moved("dequantize", numel, message, itemsize=itemsize))
        many = torch.cat([msg] * WORLD)
        record("dequantize_reduce", backend, name,
               paired(lambda: ops.dequantize_reduce(many, numel, config, dtype, True)),
               WORLD * size, bytes_moved("dequantize_reduce", numel, message))
    # fraction_best, as before the pairs: the op's fastest run against the fastest copy of the size
    best = min(all_copies)
    for r in rows:
        processed = r["gbps"] * r["seconds"] * 1e9
        r["fraction_best"] = r["gbps_max"] / (2 * size / best * processed / r["bytes_moved"] / 1e9)
    # the copy: every paired call of the size; its own limit is its fastest run
    copy = timing_row("copy", "torch", "", all_copies, size, bytes_moved("copy", numel, 0, itemsize=itemsize))
    copy.update(limit_gbps=copy["gbps_max"], fraction=copy["gbps"] / copy["gbps_max"],
                fraction_min=copy["gbps_min"] / copy["gbps_max"], fraction_max=1.0, fraction_best=1.0)
    copy["format_fraction"] = copy["fraction"]
    rows.append(copy)
    bar.update()
    return rows


def measure(device: torch.device, sizes: list[int], presets: list[str], min_time: float, reference_max: int,
            thread_counts: list[int], dtypes: list[torch.dtype] = (torch.float32,)) -> list[dict]:
    rows: list[dict] = []
    nvfp4 = torchao_nvfp4()
    before = torch.get_num_threads()
    bar = tqdm(total=len(thread_counts) * len(dtypes) * len(sizes) * (5 + 3 * len(presets)), desc="kernels",
               unit="case", file=sys.stderr)
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for dtype in dtypes:
                for size in sizes:
                    rows += measure_size(device, size, threads, presets, min_time, reference_max, nvfp4, bar, dtype)
    finally:
        torch.set_num_threads(before)
        bar.close()
    return rows


def summary(rows: list[dict], size: int, threads: int, dtype: str = "float32") -> dict:
    """At one size, thread count and input dtype: the fractions of the memory-bound limit against
    the targets, and fp4quant's quantize against torchao's NVFP4, the reference, clone and
    torch's FP8 cast."""
    at = {(r["op"], r["impl"], r["preset"]): r for r in rows
          if r["size_bytes"] == size and r["threads"] == threads and r.get("dtype", "float32") == dtype}

    def get(op, impl, preset, key="gbps"):
        row = at.get((op, impl, preset))
        return row.get(key) if row else None

    ours = get("quantize", "native", "fp4quant")
    out = {"size_bytes": size, "threads": threads, "dtype": dtype, "fp4quant_quantize_gbps": ours,
           "copy_gbps": get("copy", "torch", ""), "quantize_limit_gbps": get("quantize", "native", "fp4quant", "limit_gbps")}
    for key, other in (("torchao_nvfp4", get("quantize", "torchao", "nvfp4")),
                       ("reference", get("quantize", "reference", "fp4quant")), ("clone", get("clone", "torch", "")),
                       ("cast_fp8", get("cast_fp8", "torch", "e4m3fn"))):
        out[f"{key}_gbps"] = other
        out[f"fp4quant_over_{key}"] = ours / other if ours and other else None
    for preset, target in TARGETS.items():
        for op in ("quantize", "dequantize", "dequantize_reduce"):
            out[f"{preset}_{op}_fraction"] = get(op, "native", preset, "fraction")
            out[f"{preset}_{op}_fraction_best"] = get(op, "native", preset, "fraction_best")
        out[f"{preset}_quantize_format_fraction"] = get("quantize", "native", preset, "format_fraction")
        out[f"{preset}_quantize_target"] = target
    warp, naive = ours, get("quantize", "native", "naive_pack")
    out["warp_over_naive_packing"] = warp / naive if warp and naive else None
    return out


def thread_list(spec: str | None, device: torch.device | str = "cpu") -> list[int]:
    """The torch thread counts to measure: `spec` ("1,2"), or by default 1 and all on a CPU and
    1 on CUDA (a GPU kernel's speed does not depend on torch's CPU threads: a second count
    would measure every case twice)."""
    if spec is None:
        return [1] if torch.device(device).type == "cuda" else sorted({1, torch.get_num_threads()})
    counts = [int(t) for t in spec.split(",")]
    if not counts or min(counts) < 1:
        raise ValueError(f"--threads wants positive thread counts separated by commas, got {spec!r}")
    return counts


def dtype_list(spec: str) -> list[torch.dtype]:
    names = [d.strip() for d in spec.split(",") if d.strip()]
    bad = [d for d in names if d not in DTYPES]
    if not names or bad:
        raise ValueError(f"--dtypes wants some of {', '.join(DTYPES)} separated by commas, got {spec!r}")
    return [DTYPES[d] for d in dict.fromkeys(names)]


def torchao_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torchao")
    except Exception:  # noqa: BLE001
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None, help="CSV path (default data/kernels_<device>.csv)")
    ap.add_argument("--quick", action="store_true", help="two small sizes, fewer presets (a smoke test)")
    ap.add_argument("--threads", default=None,
                    help="torch thread counts, e.g. 1,2 (default: 1 and all on a CPU, 1 on CUDA)")
    ap.add_argument("--dtypes", default="float32",
                    help="input dtypes, e.g. float32,bfloat16 (default float32); sizes are bytes in each dtype")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of timed runs per case (at least 5 runs)")
    ap.add_argument("--reference-max-mib", type=int, default=64, help="largest size the slow reference is timed at")
    ap.add_argument("--max-mib", type=int, default=None, help="largest size measured (default: all, up to 256 MiB)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no GPU")
    try:
        thread_counts = thread_list(args.threads, device)
        dtypes = dtype_list(args.dtypes)
    except ValueError as exc:
        ap.error(str(exc))
    out = args.out or f"data/kernels_{device.type}.csv"
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.max_mib is not None:
        sizes = [s for s in sizes if s <= args.max_mib * MiB]
        if not sizes:
            ap.error(f"--max-mib {args.max_mib} leaves no size to measure (the smallest is {min(SIZES) // 1024} KiB)")
    presets = ["fp4quant", "no_fwht", "naive_pack", "nvfp4"] if args.quick else PRESETS_MEASURED
    native = ops.extension()[0]
    isa = native.cpu_isa() if native is not None else None
    nvfp4 = torchao_nvfp4()
    prov = provenance(device, threads=thread_counts, backend=ops.backend(device), cpu_isa=isa, sizes=sizes,
                      dtypes=[dtype_name(d) for d in dtypes],
                      torchao=(torchao_version() or "importable") if nvfp4 is not None else "absent",
                      load_average_before=list(os.getloadavg()))
    rows = measure(device, sizes, presets, 0.05 if args.quick else args.min_time, args.reference_max_mib * MiB,
                   thread_counts, dtypes)
    prov["load_average_after"] = list(os.getloadavg())
    for r in rows:
        r.update(device=device.type, hardware=prov["hardware"], cpu_isa=isa, torch=prov["torch"], commit=prov["commit"])
    atomic_write_csv(out, rows)
    at = min(64 * MiB, max(sizes))
    prov["summary"] = summary(rows, at, max(thread_counts), dtype_name(dtypes[0]))
    prov["summaries"] = {dtype_name(d): summary(rows, at, max(thread_counts), dtype_name(d)) for d in dtypes}
    atomic_write_json(out + ".meta.json", prov)
    print(f"wrote {len(rows)} rows to {out} (torchao: {prov['torchao']})", file=sys.stderr)
    for key, value in prov["summary"].items():
        print(f"  {key}: {value:.3g}" if isinstance(value, float) else f"  {key}: {value}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
