"""The bodies of the multi-process tests, run on every rank by tests/distributed.py (run_job).

    python tests/comm/_comm_jobs.py suite OUT.json     (OUT may hold {rank})

Ranks only measure and record (NMSEs, bit-identity across ranks, exceptions raised);
the tests assert on the recorded values, so a failed expectation on one rank never
leaves the others waiting in a collective.  A check that raises records its traceback.
The checks here are on the collectives' numbers; those on their contract (validation,
accounting, dispatch, the byte exchange) are in _comm_jobs_contract.py.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import torch
import torch.distributed as dist

import fp4quant.comm as comm
from fp4quant.format.config import QuantConfig

import _comm_jobs_contract
from _comm_rank import ALGOS, BLOCK, COMPRESSED, Rank, equal_bits, identical, nmse, raised


def check_errors(ctx: Rank) -> dict:
    """NMSE against the exact FP32 sum, per preset and algorithm; bit-identity."""
    n = 49152 + 1001
    out = {}
    for preset in COMPRESSED:
        for algo in ALGOS:
            y = ctx.inp(ctx.rank, n, seed=1)
            comm.all_reduce(y, preset, algorithm=algo)
            out[f"{preset}/{algo}"] = {"nmse": nmse(y, ctx.exact(n, seed=1)), "identical": identical(y)}
    return out


def check_uncompressed(ctx: Rank) -> dict:
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for cfg in (None, "bf16"):
            ref = ctx.inp(ctx.rank, 5000, dtype, seed=2)
            dist.all_reduce(ref)
            y = ctx.inp(ctx.rank, 5000, dtype, seed=2)
            comm.all_reduce(y, cfg)
            a = ctx.inp(ctx.rank, 5000, dtype, seed=2)
            comm.all_reduce(a, cfg, op="avg")
            out[f"{dtype}/{cfg}"] = {"equal_torch": equal_bits(y, ref), "avg": equal_bits(a, ref / ctx.world)}
    return out


def check_avg(ctx: Rank) -> dict:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for algo in ALGOS:
            s = ctx.inp(ctx.rank, 7000, dtype, seed=3)
            a = s.clone()
            comm.all_reduce(s, "fp4quant", algorithm=algo)
            comm.all_reduce(a, "fp4quant", algorithm=algo, op="avg")
            out[f"{dtype}/{algo}"] = equal_bits(a, s / ctx.world)
    return out


def check_nan(ctx: Rank) -> dict:
    """Rank W-1 holds a NaN and an Inf; their micro-group (FWHT group) is NaN everywhere."""
    n = 2 * ctx.world * BLOCK + 100
    i_nan, i_inf = BLOCK + 37, n - 50
    out = {}
    for preset in COMPRESSED:
        cfg = QuantConfig.preset(preset)
        unit = cfg.group if cfg.fwht != "none" else cfg.micro_group
        for algo in ALGOS:
            y = ctx.inp(ctx.rank, n, seed=4)
            if ctx.rank == ctx.world - 1:
                y[i_nan], y[i_inf] = float("nan"), float("inf")
            comm.all_reduce(y, preset, algorithm=algo)
            mask = torch.zeros(n, dtype=torch.bool, device=y.device)
            for i in (i_nan, i_inf):
                mask[i // unit * unit : (i // unit + 1) * unit] = True
            out[f"{preset}/{algo}"] = {
                "region_nan": bool(torch.isnan(y[mask]).all()),
                "rest_finite": bool(torch.isfinite(y[~mask]).all()),
                "identical": identical(y),
            }
    return out


def check_overflow(ctx: Rank) -> dict:
    """Sums that overflow the dtype (float16 60000 on every rank; float32 3e38) against the
    uncompressed all-reduce: +-inf where it is +-inf; and huge sums that fit stay finite."""
    n = 2 * ctx.world * BLOCK + 100
    signs = torch.where(torch.arange(n) // 64 % 2 == 0, 1.0, -1.0).to(ctx.device)
    out = {}
    for dtype, value in ((torch.float16, 60000.0), (torch.float32, 3e38), (torch.float32, 1e37)):
        ref = (value * signs).to(dtype)
        dist.all_reduce(ref)
        for preset in ("fp4quant", "nvfp4", "fp8"):
            for algo in ALGOS + ("reduce_scatter",):
                x = (value * signs).to(dtype)
                if algo == "reduce_scatter":
                    y = torch.empty(n, dtype=dtype, device=ctx.device)
                    comm.reduce_scatter(y, x.repeat(ctx.world), preset)
                else:
                    comm.all_reduce(x, preset, algorithm=algo)
                    y = x
                out[f"{dtype}/{value:g}/{preset}/{algo}"] = {
                    "inf_as_torch": torch.equal(torch.isinf(y), torch.isinf(ref)) and equal_bits(y[torch.isinf(y)], ref[torch.isinf(ref)]),
                    "nan": int(torch.isnan(y).sum()),
                    "ref_inf": int(torch.isinf(ref).sum()),
                }
    return out


def check_sizes(ctx: Rank) -> dict:
    out = {}
    for n in (0, 1, 17, ctx.world * BLOCK + 5, 3 * ctx.world * BLOCK):
        for algo in ALGOS:
            y = ctx.inp(ctx.rank, n, seed=5)
            comm.all_reduce(y, "fp4quant", algorithm=algo)
            out[f"all_reduce/{n}/{algo}"] = {
                "shape": list(y.shape),
                "nmse": nmse(y, ctx.exact(n, seed=5)) if n else 0.0,
                "identical": identical(y),
            }
        x = ctx.inp(ctx.rank, n, seed=6)
        g = torch.empty(ctx.world * n, device=ctx.device)
        comm.all_gather(g, x, "fp4quant")
        ref = torch.cat([ctx.inp(r, n, seed=6) for r in range(ctx.world)])
        out[f"all_gather/{n}"] = {"nmse": nmse(g, ref) if n else 0.0, "identical": identical(g)}
        x = ctx.inp(ctx.rank, ctx.world * n, seed=7)
        o = torch.empty(n, device=ctx.device)
        comm.reduce_scatter(o, x, "fp4quant")
        ref = ctx.exact(ctx.world * n, seed=7)[ctx.rank * n : (ctx.rank + 1) * n]
        out[f"reduce_scatter/{n}"] = {"nmse": nmse(o, ref) if n else 0.0}
    return out


def check_dtypes(ctx: Rank) -> dict:
    out = {}
    n = 20000
    for dtype in (torch.bfloat16, torch.float16):
        for algo in ALGOS:
            y = ctx.inp(ctx.rank, n, dtype, seed=8)
            comm.all_reduce(y, "fp4quant", algorithm=algo)
            out[f"{dtype}/{algo}"] = {
                "dtype": str(y.dtype),
                "nmse": nmse(y, ctx.exact(n, dtype, seed=8)),
                "identical": identical(y),
            }
    return out


def check_noncontiguous(ctx: Rank) -> dict:
    out = {}
    for cfg in ("fp4quant", None):
        for algo in ALGOS:
            base = ctx.inp(ctx.rank, 64 * 300, seed=9, shape=(64, 300))
            keep = base[:, 1::2].clone()
            view = base[:, ::2]
            ref = view.clone()
            comm.all_reduce(ref, cfg, algorithm=algo)
            comm.all_reduce(view, cfg, algorithm=algo)
            t = ctx.inp(ctx.rank, 64 * 300, seed=9, shape=(64, 300)).t()
            tref = t.contiguous()
            comm.all_reduce(tref, cfg, algorithm=algo)
            comm.all_reduce(t, cfg, algorithm=algo)
            out[f"{cfg}/{algo}"] = {
                "strided": equal_bits(view, ref) and equal_bits(base[:, 1::2], keep),
                "transposed": equal_bits(t, tref),
            }
    x = ctx.inp(ctx.rank, 600, seed=10, shape=(20, 30)).t()
    big = torch.zeros(ctx.world * 30, 40, device=ctx.device)
    outv = big[:, ::2]
    comm.all_gather(outv, x, "fp4quant")
    ref = torch.empty(ctx.world * 30, 20, device=ctx.device)
    comm.all_gather(ref, x.contiguous(), "fp4quant")
    out["all_gather/noncontiguous"] = equal_bits(outv, ref) and bool((big[:, 1::2] == 0).all())
    return out


def check_groups(ctx: Rank) -> dict:
    if ctx.world < 2:
        return {}
    out = {}
    for name, members in (("even", list(range(0, ctx.world, 2))), ("tail", list(range(1, ctx.world)))):
        g = dist.new_group(members)
        member = ctx.rank in members
        y = ctx.inp(ctx.rank, 9000, seed=11)
        before = y.clone()
        comm.all_reduce(y, "fp4quant", group=g)
        u = ctx.inp(ctx.rank, 9000, seed=11)
        comm.all_reduce(u, "bf16", group=g)
        res: dict[str, Any] = {"member": member}
        if member:
            ref = ctx.inp(ctx.rank, 9000, seed=11)
            dist.all_reduce(ref, group=g)
            res.update(
                nmse=nmse(y, ctx.exact(9000, seed=11, ranks=members)),
                identical=identical(y, g),
                bf16_equal=equal_bits(u, ref),
            )
            if len(members) > 1:
                bad = ctx.inp(ctx.rank, 9000 if ctx.rank != members[-1] else 9001, seed=11)
                res["validate_error"] = raised(lambda: comm.all_reduce(bad, "fp4quant", group=g, validate=True))
        else:
            res["unchanged"] = equal_bits(y, before) and equal_bits(u, before)
        out[name] = res
    return out


def check_stochastic(ctx: Rank) -> dict:
    cfg = QuantConfig.preset("fp4quant", rounding="stochastic")
    n = 30000
    out = {}
    streams = comm.RandomStreams()
    for algo in ALGOS:
        a, b = ctx.inp(ctx.rank, n, seed=12), ctx.inp(ctx.rank, n, seed=12)
        comm.all_reduce(a, cfg, algorithm=algo, streams=streams)
        comm.all_reduce(b, cfg, algorithm=algo, streams=streams)
        out[algo] = {
            "identical": identical(a) and identical(b),
            "calls_differ": not equal_bits(a, b),
            "nmse": nmse(a, ctx.exact(n, seed=12)),
        }
    return out


def check_chunked(ctx: Rank) -> dict:
    W = ctx.world
    n = 8 * W * BLOCK + 77
    chunk = 2 * W * BLOCK * 4
    out = {}
    for preset in ("fp4quant", "nvfp4"):
        for algo in ALGOS:
            y, ref = ctx.inp(ctx.rank, n, seed=15), ctx.inp(ctx.rank, n, seed=15)
            comm.all_reduce(y, preset, algorithm=algo, chunk_bytes=chunk)
            comm.all_reduce(ref, preset, algorithm=algo)
            out[f"{preset}/{algo}"] = {
                "equal_unchunked": equal_bits(y, ref),
                "identical": identical(y),
                "nmse": nmse(y, ctx.exact(n, seed=15)),
            }
    x = ctx.inp(ctx.rank, n, seed=16)
    g, gref = torch.empty(W * n, device=ctx.device), torch.empty(W * n, device=ctx.device)
    comm.all_gather(g, x, "fp4quant", chunk_bytes=chunk)
    comm.all_gather(gref, x, "fp4quant")
    out["all_gather"] = equal_bits(g, gref)
    x = ctx.inp(ctx.rank, W * n, seed=17)
    o, oref = torch.empty(n, device=ctx.device), torch.empty(n, device=ctx.device)
    comm.reduce_scatter(o, x, "fp4quant", chunk_bytes=BLOCK * 4)
    comm.reduce_scatter(oref, x, "fp4quant")
    out["reduce_scatter"] = equal_bits(o, oref)
    return out


def check_gather_scatter(ctx: Rank) -> dict:
    W, r = ctx.world, ctx.rank
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = ctx.inp(r, 6 * 50, dtype, seed=18, shape=(6, 50))
        for cfg in (None, "bf16"):
            g, ref = (torch.empty(W * 6, 50, dtype=dtype, device=ctx.device) for _ in range(2))
            comm.all_gather(g, x, cfg)
            dist.all_gather_into_tensor(ref, x)
            big = ctx.inp(r, W * 300, dtype, seed=19, shape=(W * 6, 50))
            o, oref, oavg = (torch.empty(6, 50, dtype=dtype, device=ctx.device) for _ in range(3))
            comm.reduce_scatter(o, big, cfg)
            comm.reduce_scatter(oavg, big, cfg, op="avg")
            dist.reduce_scatter_tensor(oref, big)
            out[f"{dtype}/{cfg}"] = {
                "all_gather_exact": equal_bits(g, ref),
                "reduce_scatter_exact": equal_bits(o, oref),
                "reduce_scatter_avg": equal_bits(oavg, oref / W),
            }
    n = 20000
    for preset in COMPRESSED:
        x = ctx.inp(r, n, seed=20)
        g = torch.empty(W * n, device=ctx.device)
        comm.all_gather(g, x, preset)
        ref = torch.cat([ctx.inp(q, n, seed=20) for q in range(W)])
        big = ctx.inp(r, W * n, seed=21)
        o = torch.empty(n, device=ctx.device)
        comm.reduce_scatter(o, big, preset)
        out[preset] = {
            "all_gather_nmse": nmse(g, ref),
            "all_gather_identical": identical(g),
            "reduce_scatter_nmse": nmse(o, ctx.exact(W * n, seed=21)[r * n : (r + 1) * n]),
        }
    return out


CHECKS = {name[6:]: fn for module in (globals(), vars(_comm_jobs_contract))
          for name, fn in module.items() if name.startswith("check_")}


def main() -> int:
    job = sys.argv[1]
    ctx = Rank()
    out_path = sys.argv[2].format(rank=ctx.rank)
    dist.init_process_group(ctx.backend, device_id=ctx.device if ctx.backend == "nccl" else None)
    results: dict[str, Any] = {"world": ctx.world, "rank": ctx.rank}
    names = list(CHECKS) if job == "suite" else job.split(",")
    for name in names:
        try:
            results[name] = CHECKS[name](ctx)
        except Exception:  # noqa: BLE001 - the test reports it
            results[name] = {"error": traceback.format_exc()}
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
