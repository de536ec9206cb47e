"""The codec ops as scripts/gpu_check.sh needs them beside its test suite:

    python scripts/gpu_ops.py once  [--device cuda] [--quick]
    python scripts/gpu_ops.py large [--device cuda] [--numel N] [--boundary B] [--dtypes float32,bfloat16]
        [--out large.json]

once   every op (quantize, dequantize into a new tensor and into a given one, dequantize_reduce
       re-quantized and not, of 2 and 3 messages) of every compressed preset, for float32,
       bfloat16 and float16 inputs, once each at small sizes: unaligned lengths, several rows,
       an input that starts off its vector alignment.  Made to run under compute-sanitizer
       (memcheck, racecheck, synccheck): its inputs are made on the CPU and copied over, so that
       nearly every kernel launched is one of fp4quant's.  --quick: fewer cases (racecheck
       is the slowest tool).
large  one tensor of N = 2^31 + 2^20 values (default; ~8.6 GB of float32) through quantize,
       dequantize and dequantize_reduce on the device, each result checked bit for bit
       against the pure-PyTorch reference on blocks at the start, in the middle, on both
       sides of value 2^31 (--boundary: where 32-bit element indices wrap) and at the end;
       the message's length against the layout, the decoded tensor's values beyond the
       boundary against the input's (finite, not all zero).  Writes a JSON record (--out).

Exit status 1 when a check fails.  On a CPU both run at small sizes (the tests do that).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fp4quant import ops  # noqa: E402
from fp4quant.format.config import PRESETS, QuantConfig  # noqa: E402
from fp4quant.format.packed import layout, slice_messages  # noqa: E402
from fp4quant.provenance import atomic_write_json, provenance  # noqa: E402
from fp4quant.reference import codec as reference  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COMPRESSED = [p for p in PRESETS if QuantConfig.preset(p).compressed]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def once(device: torch.device, quick: bool) -> int:
    """Each op once per (preset, dtype, shape); the kernels' own checks (and a sanitizer around
    the process) find what goes wrong; the results are checked only for their shapes."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(1, 1000), (3, 2 * 4096 + 5)] if quick else [(1, 1000), (3, 2 * 4096 + 5), (2, (1 << 16) + 17)]
    dtypes = ["float32", "bfloat16"] if quick else list(DTYPES)
    calls = 0
    t0 = time.monotonic()
    for preset in COMPRESSED:
        config = QuantConfig.preset(preset)
        for name in dtypes:
            dtype = DTYPES[name]
            for rows, n in shapes:
                host = torch.randn(rows, n + 1, generator=gen).to(dtype)
                x = host.to(device)
                for strided, inp in ((False, x[:, :n].contiguous()), (True, x[:, 1:])):  # one element off: strided rows
                    msgs = ops.quantize_rows(inp, config, seed=7, offset=3)
                    assert msgs.shape == (rows, layout(n, config).nbytes), (preset, name, msgs.shape)
                    vals = ops.dequantize_rows(msgs, n, config, dtype)
                    out = torch.empty(rows, n, device=device, dtype=dtype)
                    ops.dequantize_rows(msgs, n, config, dtype, saturate=False, out=out)
                    assert vals.shape == out.shape == (rows, n)
                    calls += 3
                    if quick and strided:
                        continue
                    for world in (2, 3):
                        many = msgs[:1].expand(world, -1).contiguous()
                        summed = ops.dequantize_reduce(many, n, config, dtype, requantize=True, seed=7, offset=3)
                        plain = ops.dequantize_reduce(many, n, config, dtype, requantize=False)
                        assert summed.numel() == layout(n, config).nbytes and plain.numel() == n
                        calls += 2
            sync(device)
        print(f"{preset}: ok", flush=True)
    sync(device)
    print(f"{calls} op calls on {device} ({ops.backend(device)} kernels) in {time.monotonic() - t0:.1f} s")
    return 0


def check_blocks(what: str, got: torch.Tensor, want: torch.Tensor, failures: list[str]) -> None:
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or not torch.equal(got.view(torch.uint8) if got.dtype == torch.uint8 else got, want):
        bad = (got != want).nonzero()[:3].flatten().tolist() if got.shape == want.shape else "shape"
        failures.append(f"{what}: differs from the reference (first differences at {bad})")


def large(device: torch.device, numel: int, boundary: int, dtypes: list[str], preset: str, out: str | None) -> int:
    config = QuantConfig.preset(preset)
    block = config.block
    if config.coarse_scale == "tensor":
        sys.exit(f"gpu_ops large: {preset} has one scale for the whole tensor: its blocks cannot be checked alone")
    lay = layout(numel, config)
    blocks = lay.padded // block
    edge = boundary // block  # the block that holds value `boundary`
    picks = sorted({0, blocks // 2, max(edge - 1, 0), min(edge, blocks - 1), min(edge + 1, blocks - 1), blocks - 1})
    record = {"numel": numel, "boundary": boundary, "preset": preset, "block": block, "blocks_checked": picks,
              "message_bytes": lay.nbytes, "dtypes": {}, "device": str(device), "backend": ops.backend(device)}
    failures: list[str] = []
    for name in dtypes:
        dtype = DTYPES[name]
        t0 = time.monotonic()
        checks = 0
        x = torch.randn(numel, device=device, dtype=dtype)
        x[-3:] = torch.tensor([1e4, -3e3, 7.0], dtype=dtype, device=device)  # the last block's scale differs
        sync(device)
        msg = ops.quantize_rows(x[None], config, seed=11, offset=0)
        sync(device)
        if msg.shape != (1, lay.nbytes):
            failures.append(f"{name} quantize: message of shape {tuple(msg.shape)}, the layout says (1, {lay.nbytes})")
            continue
        for b in picks:  # each block's bytes are those of quantizing its values alone
            lo, hi = b * block, min((b + 1) * block, numel)
            want = reference.quantize_rows(x[lo:hi].cpu()[None], config, seed=11, offset=lo)
            got = slice_messages(msg, numel, config, lo, (b + 1) * block)
            check_blocks(f"{name} quantize, block {b} (values {lo}..{hi - 1})", got, want, failures)
            checks += 1
        vals = ops.dequantize_rows(msg, numel, config, dtype)[0]
        sync(device)
        beyond = vals[boundary:] if boundary < numel else vals[-1:]
        if not bool(torch.isfinite(beyond).all()) or not bool((beyond != 0).any()):
            failures.append(f"{name} dequantize: the values past {boundary} are not finite or all zero")
        for b in picks:
            lo, hi = b * block, min((b + 1) * block, numel)
            part = slice_messages(msg, numel, config, lo, (b + 1) * block).cpu()
            want = reference.dequantize_rows(part, hi - lo, config, dtype)[0]
            check_blocks(f"{name} dequantize, block {b}", vals[lo:hi], want, failures)
            checks += 1
        # the decoded tensor against the input, past the boundary: a wrapped index would decode
        # another block's values there
        err = (vals[-block:].float() - x[-block:].float()).norm() / x[-block:].float().norm()
        record.setdefault("last_block_relative_error", {})[name] = float(err)
        if not err < 0.5:
            failures.append(f"{name} dequantize: the last block's relative error is {float(err):.3g}")
        del vals
        two = torch.cat([msg, msg])  # two ranks' messages: the reduce of 2 * (2^31 + 2^20) values
        summed = ops.dequantize_reduce(two, numel, config, dtype, requantize=True, seed=11, offset=0)
        sync(device)
        for b in picks:
            lo, hi = b * block, min((b + 1) * block, numel)
            part = slice_messages(two, numel, config, lo, (b + 1) * block).cpu()
            want = reference.dequantize_reduce(part, hi - lo, config, dtype, True, seed=11, offset=lo)
            got = slice_messages(summed.view(1, -1), numel, config, lo, (b + 1) * block)[0]
            check_blocks(f"{name} dequantize_reduce, block {b}", got, want, failures)
            checks += 1
        del x, msg, two, summed
        if device.type == "cuda":
            torch.cuda.empty_cache()
            record.setdefault("max_memory_allocated_gib", {})[name] = torch.cuda.max_memory_allocated() / 2**30
        record["dtypes"][name] = {"checks": checks, "seconds": round(time.monotonic() - t0, 2)}
        print(f"{name}: {numel} values, {checks} block checks in {time.monotonic() - t0:.1f} s", flush=True)
    record["failures"] = failures
    record["passed"] = not failures
    if out:
        atomic_write_json(out, {**record, "provenance": provenance(device)})
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    print("large: " + ("passed" if not failures else f"{len(failures)} checks failed"))
    return 0 if not failures else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    o = sub.add_parser("once", help="each op once at small sizes (for compute-sanitizer)")
    o.add_argument("--device", default="cuda")
    o.add_argument("--quick", action="store_true")
    g = sub.add_parser("large", help="a tensor past 2^31 values, checked against the reference on some blocks")
    g.add_argument("--device", default="cuda")
    g.add_argument("--numel", type=int, default=(1 << 31) + (1 << 20))
    g.add_argument("--boundary", type=int, default=1 << 31)
    g.add_argument("--dtypes", default="float32,bfloat16")
    g.add_argument("--preset", default="fp4quant")
    g.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no GPU")
    if a.command == "once":
        return once(device, a.quick)
    names = [d for d in a.dtypes.split(",") if d]
    if not names or any(d not in DTYPES for d in names):
        ap.error(f"--dtypes wants some of {', '.join(DTYPES)}")
    if a.preset not in COMPRESSED:
        ap.error(f"--preset wants one of {', '.join(COMPRESSED)}")
    return large(device, a.numel, a.boundary, names, a.preset, a.out)


if __name__ == "__main__":
    sys.exit(main())
