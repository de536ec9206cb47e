"""The bodies of the multi-process tests, run on every rank by tests/distributed.py (run_job).

    python tests/comm/_comm_jobs.py suite OUT.json     (OUT may hold {rank})

Ranks only measure and record (NMSEs, bit-identity across ranks, exceptions raised);
the tests assert on the recorded values, so a failed expectation on one rank never
leaves the others waiting in a collective.  A check that raises records its traceback.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

import fp4quant.comm as comm
import fp4quant.comm.validate as vd
from fp4quant.format.config import QuantConfig
from fp4quant.format.packed import layout

COMPRESSED = ("fp4quant", "no_fwht", "single_scale", "nvfp4", "mxfp4", "int4", "fp8")
ALGOS = ("one_shot", "two_shot")
BLOCK = QuantConfig.preset("fp4quant").block


class Ctx:
    def __init__(self) -> None:
        self.backend = os.environ.get("FP4QUANT_TEST_BACKEND", "gloo")
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        if self.backend == "nccl":
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")


C: Ctx


def inp(rank: int, n: int, dtype=torch.float32, seed: int = 0, shape=None) -> torch.Tensor:
    """Rank ``rank``'s input: the same on every process that asks (so each rank knows all)."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    x = torch.randn(n, generator=g).to(dtype)
    return x.reshape(shape if shape is not None else (n,)).to(C.device)


def exact(n: int, dtype=torch.float32, seed: int = 0, ranks=None) -> torch.Tensor:
    ranks = range(C.world) if ranks is None else ranks
    return sum(inp(r, n, dtype, seed).double() for r in ranks)


def nmse(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double().reshape(-1), ref.double().reshape(-1)
    return float(((y - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-300))


def bits(t: torch.Tensor) -> torch.Tensor:
    itype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    return t.contiguous().view(itype).to(torch.int32).reshape(-1)


def identical(t: torch.Tensor, group=None) -> bool:
    """Bit-identical on every rank of ``group``."""
    b = bits(t)
    outs = [torch.empty_like(b) for _ in range(dist.get_world_size(group))]
    dist.all_gather(outs, b, group=group)
    return all(torch.equal(o, outs[0]) for o in outs)


def equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def raised(fn: Callable[[], Any]) -> dict[str, str] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
        return {"type": type(exc).__name__, "msg": str(exc)}
    return None


# --- checks ---------------------------------------------------------------------------


def check_errors() -> dict:
    """NMSE against the exact FP32 sum, per preset and algorithm; bit-identity."""
    n = 49152 + 1001
    out = {}
    for preset in COMPRESSED:
        for algo in ALGOS:
            y = inp(C.rank, n, seed=1)
            comm.all_reduce(y, preset, algorithm=algo)
            out[f"{preset}/{algo}"] = {"nmse": nmse(y, exact(n, seed=1)), "identical": identical(y)}
    return out


def check_uncompressed() -> dict:
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for cfg in (None, "bf16"):
            ref = inp(C.rank, 5000, dtype, seed=2)
            dist.all_reduce(ref)
            y = inp(C.rank, 5000, dtype, seed=2)
            comm.all_reduce(y, cfg)
            a = inp(C.rank, 5000, dtype, seed=2)
            comm.all_reduce(a, cfg, op="avg")
            out[f"{dtype}/{cfg}"] = {"equal_torch": equal_bits(y, ref), "avg": equal_bits(a, ref / C.world)}
    return out


def check_avg() -> dict:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for algo in ALGOS:
            s = inp(C.rank, 7000, dtype, seed=3)
            a = s.clone()
            comm.all_reduce(s, "fp4quant", algorithm=algo)
            comm.all_reduce(a, "fp4quant", algorithm=algo, op="avg")
            out[f"{dtype}/{algo}"] = equal_bits(a, s / C.world)
    return out


def check_nan() -> dict:
    """Rank W-1 holds a NaN and an Inf; their micro-group (FWHT group) is NaN everywhere."""
    n = 2 * C.world * BLOCK + 100
    i_nan, i_inf = BLOCK + 37, n - 50
    out = {}
    for preset in COMPRESSED:
        cfg = QuantConfig.preset(preset)
        unit = cfg.group if cfg.fwht != "none" else cfg.micro_group
        for algo in ALGOS:
            y = inp(C.rank, n, seed=4)
            if C.rank == C.world - 1:
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


def check_overflow() -> dict:
    """Sums that overflow the dtype (float16 60000 on every rank; float32 3e38) against the
    uncompressed all-reduce: +-inf where it is +-inf; and huge sums that fit stay finite."""
    n = 2 * C.world * BLOCK + 100
    signs = torch.where(torch.arange(n) // 64 % 2 == 0, 1.0, -1.0).to(C.device)
    out = {}
    for dtype, value in ((torch.float16, 60000.0), (torch.float32, 3e38), (torch.float32, 1e37)):
        ref = (value * signs).to(dtype)
        dist.all_reduce(ref)
        for preset in ("fp4quant", "nvfp4", "fp8"):
            for algo in ALGOS + ("reduce_scatter",):
                x = (value * signs).to(dtype)
                if algo == "reduce_scatter":
                    y = torch.empty(n, dtype=dtype, device=C.device)
                    comm.reduce_scatter(y, x.repeat(C.world), preset)
                else:
                    comm.all_reduce(x, preset, algorithm=algo)
                    y = x
                out[f"{dtype}/{value:g}/{preset}/{algo}"] = {
                    "inf_as_torch": torch.equal(torch.isinf(y), torch.isinf(ref)) and equal_bits(y[torch.isinf(y)], ref[torch.isinf(ref)]),
                    "nan": int(torch.isnan(y).sum()),
                    "ref_inf": int(torch.isinf(ref).sum()),
                }
    return out


def check_sizes() -> dict:
    out = {}
    for n in (0, 1, 17, C.world * BLOCK + 5, 3 * C.world * BLOCK):
        for algo in ALGOS:
            y = inp(C.rank, n, seed=5)
            comm.all_reduce(y, "fp4quant", algorithm=algo)
            out[f"all_reduce/{n}/{algo}"] = {
                "shape": list(y.shape),
                "nmse": nmse(y, exact(n, seed=5)) if n else 0.0,
                "identical": identical(y),
            }
        x = inp(C.rank, n, seed=6)
        g = torch.empty(C.world * n, device=C.device)
        comm.all_gather(g, x, "fp4quant")
        ref = torch.cat([inp(r, n, seed=6) for r in range(C.world)])
        out[f"all_gather/{n}"] = {"nmse": nmse(g, ref) if n else 0.0, "identical": identical(g)}
        x = inp(C.rank, C.world * n, seed=7)
        o = torch.empty(n, device=C.device)
        comm.reduce_scatter(o, x, "fp4quant")
        ref = exact(C.world * n, seed=7)[C.rank * n : (C.rank + 1) * n]
        out[f"reduce_scatter/{n}"] = {"nmse": nmse(o, ref) if n else 0.0}
    return out


def check_dtypes() -> dict:
    out = {}
    n = 20000
    for dtype in (torch.bfloat16, torch.float16):
        for algo in ALGOS:
            y = inp(C.rank, n, dtype, seed=8)
            comm.all_reduce(y, "fp4quant", algorithm=algo)
            out[f"{dtype}/{algo}"] = {
                "dtype": str(y.dtype),
                "nmse": nmse(y, exact(n, dtype, seed=8)),
                "identical": identical(y),
            }
    return out


def check_noncontiguous() -> dict:
    out = {}
    for cfg in ("fp4quant", None):
        for algo in ALGOS:
            base = inp(C.rank, 64 * 300, seed=9, shape=(64, 300))
            keep = base[:, 1::2].clone()
            view = base[:, ::2]
            ref = view.clone()
            comm.all_reduce(ref, cfg, algorithm=algo)
            comm.all_reduce(view, cfg, algorithm=algo)
            t = inp(C.rank, 64 * 300, seed=9, shape=(64, 300)).t()
            tref = t.contiguous()
            comm.all_reduce(tref, cfg, algorithm=algo)
            comm.all_reduce(t, cfg, algorithm=algo)
            out[f"{cfg}/{algo}"] = {
                "strided": equal_bits(view, ref) and equal_bits(base[:, 1::2], keep),
                "transposed": equal_bits(t, tref),
            }
    x = inp(C.rank, 600, seed=10, shape=(20, 30)).t()
    big = torch.zeros(C.world * 30, 40, device=C.device)
    outv = big[:, ::2]
    comm.all_gather(outv, x, "fp4quant")
    ref = torch.empty(C.world * 30, 20, device=C.device)
    comm.all_gather(ref, x.contiguous(), "fp4quant")
    out["all_gather/noncontiguous"] = equal_bits(outv, ref) and bool((big[:, 1::2] == 0).all())
    return out


def check_groups() -> dict:
    if C.world < 2:
        return {}
    out = {}
    for name, members in (("even", list(range(0, C.world, 2))), ("tail", list(range(1, C.world)))):
        g = dist.new_group(members)
        member = C.rank in members
        y = inp(C.rank, 9000, seed=11)
        before = y.clone()
        comm.all_reduce(y, "fp4quant", group=g)
        u = inp(C.rank, 9000, seed=11)
        comm.all_reduce(u, "bf16", group=g)
        res: dict[str, Any] = {"member": member}
        if member:
            ref = inp(C.rank, 9000, seed=11)
            dist.all_reduce(ref, group=g)
            res.update(
                nmse=nmse(y, exact(9000, seed=11, ranks=members)),
                identical=identical(y, g),
                bf16_equal=equal_bits(u, ref),
            )
            if len(members) > 1:
                bad = inp(C.rank, 9000 if C.rank != members[-1] else 9001, seed=11)
                res["validate_error"] = raised(lambda: comm.all_reduce(bad, "fp4quant", group=g, validate=True))
        else:
            res["unchanged"] = equal_bits(y, before) and equal_bits(u, before)
        out[name] = res
    return out


def check_validation() -> dict:
    W, last = C.world, C.world - 1
    out: dict[str, Any] = {}
    calls = {"n": 0}
    real = vd.exchange

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    vd.exchange = counting
    try:
        y = inp(C.rank, 3000)
        comm.all_reduce(y, "fp4quant")
        out["fast_path_exchanges"] = calls["n"]
        out["ok"] = raised(lambda: comm.all_reduce(inp(C.rank, 3000), "fp4quant", validate=True))
        out["validated_exchanges"] = calls["n"]
    finally:
        vd.exchange = real
    dtype = torch.float16 if C.rank == last and W > 1 else torch.float32
    out["dtype"] = raised(lambda: comm.all_reduce(inp(C.rank, 3000, dtype), "fp4quant", validate=True))
    cfg = QuantConfig.preset("fp4quant", group=256 if C.rank == last and W > 1 else BLOCK)
    out["config"] = raised(lambda: comm.all_reduce(inp(C.rank, 3000), cfg, validate=True))
    op = "avg" if C.rank == last and W > 1 else "sum"
    out["op"] = raised(lambda: comm.all_reduce(inp(C.rank, 3000), "fp4quant", op=op, validate=True))
    n = 3001 if C.rank == last and W > 1 else 3000
    out["shape"] = raised(lambda: comm.all_reduce(inp(C.rank, n), "fp4quant", validate=True))
    # the same messages in another order: equal-size chunks of two phases would be swapped silently
    overlap = not (C.rank == last and W > 1)
    out["overlap"] = raised(lambda: comm.all_reduce(inp(C.rank, 40000), "fp4quant", chunk_bytes=16384, overlap=overlap,
                                                    validate=True))
    x = torch.ones(3000, dtype=torch.int64) if C.rank == last else inp(C.rank, 3000)
    out["int_validated"] = raised(lambda: comm.all_reduce(x, "fp4quant", validate=True))
    o = torch.empty(W * (10 if C.rank == last and W > 1 else 11), device=C.device)
    out["gather_shape"] = raised(lambda: comm.all_gather(o, inp(C.rank, 11), "fp4quant", validate=True))
    e = torch.empty(0, device=C.device) if C.rank != last or W == 1 else inp(C.rank, 5)
    out["empty_vs_nonempty"] = raised(lambda: comm.all_reduce(e, "fp4quant", validate=True))
    sr = QuantConfig.preset("fp4quant", rounding="stochastic")
    out["stochastic_without_streams"] = raised(lambda: comm.all_reduce(inp(C.rank, 10), sr))
    # argument errors on every rank, before any communication
    out["int"] = raised(lambda: comm.all_reduce(torch.ones(10, dtype=torch.int32), "fp4quant"))
    out["int_uncompressed"] = raised(lambda: comm.all_reduce(torch.ones(10, dtype=torch.int32)))
    out["bad_op"] = raised(lambda: comm.all_reduce(inp(C.rank, 10), "fp4quant", op="max"))
    out["bad_algorithm"] = raised(lambda: comm.all_reduce(inp(C.rank, 10), "fp4quant", algorithm="ring"))
    out["bad_rs_shape"] = raised(lambda: comm.reduce_scatter(torch.empty(3), inp(C.rank, 3 * W + 1), "fp4quant"))
    y = inp(C.rank, 100)
    comm.all_reduce(y, "fp4quant")  # still in step after all that
    out["in_step"] = identical(y)
    # validate=True on the last rank only (in a group of its own: the failed call leaves that
    # group's validation sequence one apart, as a fatal error would): it waits, then names the others
    group = dist.new_group(list(range(W)))
    if C.rank == last:
        timeout, vd.VALIDATION_TIMEOUT_S = vd.VALIDATION_TIMEOUT_S, 2.0
        try:
            out["validated_alone"] = raised(lambda: comm.all_reduce(inp(C.rank, 100), "fp4quant", group=group,
                                                                    validate=True))
        finally:
            vd.VALIDATION_TIMEOUT_S = timeout
    dist.barrier()
    return out


def check_stats() -> dict:
    W = C.world
    comm.reset_stats()
    n = 4 * W * BLOCK
    comm.all_reduce(inp(C.rank, n), "fp4quant", algorithm="two_shot", stats_key="fwd")
    comm.all_reduce(inp(C.rank, n), "fp4quant", algorithm="one_shot", stats_key="bwd")
    comm.all_reduce(inp(C.rank, n), None, stats_key="bwd")
    comm.all_reduce(inp(C.rank, 0), "fp4quant", stats_key="bwd")
    s = comm.stats()
    cfg = QuantConfig.preset("fp4quant")
    expected = {
        "fwd_sent": 2 * (W - 1) * layout(4 * BLOCK, cfg).nbytes,
        "bwd_sent": (W - 1) * layout(n, cfg).nbytes + 2 * (W - 1) * n * 4 // W,
        "fwd_uncompressed": 2 * (W - 1) * n * 4 // W,
        "bwd_uncompressed": 2 * 2 * (W - 1) * n * 4 // W,
    }
    comm.reset_stats()
    return {"stats": s, "expected": expected, "after_reset": comm.stats()}


def check_stochastic() -> dict:
    cfg = QuantConfig.preset("fp4quant", rounding="stochastic")
    n = 30000
    out = {}
    streams = comm.RandomStreams()
    for algo in ALGOS:
        a, b = inp(C.rank, n, seed=12), inp(C.rank, n, seed=12)
        comm.all_reduce(a, cfg, algorithm=algo, streams=streams)
        comm.all_reduce(b, cfg, algorithm=algo, streams=streams)
        out[algo] = {
            "identical": identical(a) and identical(b),
            "calls_differ": not equal_bits(a, b),
            "nmse": nmse(a, exact(n, seed=12)),
        }
    return out


def check_auto() -> dict:
    from fp4quant.comm import auto

    out = {}
    y, ref = inp(C.rank, 70000, seed=13), inp(C.rank, 70000, seed=13)
    dist.all_reduce(ref)
    comm.all_reduce(y, "fp4quant", algorithm="auto")
    out["table_choice"] = auto.choose(70000 * 4, C.world, C.backend)
    out["default_table"] = equal_bits(y, ref) if out["table_choice"] == "uncompressed" else identical(y)
    saved = dict(auto.TABLE)
    try:
        comm.set_table({(C.backend, C.world): comm.Thresholds(16384, 262144)})
        for n, expect in ((512, None), (4096, "one_shot"), (65536, "two_shot")):
            y = inp(C.rank, n, seed=14)
            comm.all_reduce(y, "fp4quant", algorithm="auto")
            ref = inp(C.rank, n, seed=14)
            if expect is None:
                dist.all_reduce(ref)
            else:
                comm.all_reduce(ref, "fp4quant", algorithm=expect)
            out[f"set_table/{n}"] = equal_bits(y, ref)
    finally:
        auto.TABLE.clear()
        auto.TABLE.update(saved)
    return out


def check_chunked() -> dict:
    W = C.world
    n = 8 * W * BLOCK + 77
    chunk = 2 * W * BLOCK * 4
    out = {}
    for preset in ("fp4quant", "nvfp4"):
        for algo in ALGOS:
            y, ref = inp(C.rank, n, seed=15), inp(C.rank, n, seed=15)
            comm.all_reduce(y, preset, algorithm=algo, chunk_bytes=chunk)
            comm.all_reduce(ref, preset, algorithm=algo)
            out[f"{preset}/{algo}"] = {
                "equal_unchunked": equal_bits(y, ref),
                "identical": identical(y),
                "nmse": nmse(y, exact(n, seed=15)),
            }
    x = inp(C.rank, n, seed=16)
    g, gref = torch.empty(W * n, device=C.device), torch.empty(W * n, device=C.device)
    comm.all_gather(g, x, "fp4quant", chunk_bytes=chunk)
    comm.all_gather(gref, x, "fp4quant")
    out["all_gather"] = equal_bits(g, gref)
    x = inp(C.rank, W * n, seed=17)
    o, oref = torch.empty(n, device=C.device), torch.empty(n, device=C.device)
    comm.reduce_scatter(o, x, "fp4quant", chunk_bytes=BLOCK * 4)
    comm.reduce_scatter(oref, x, "fp4quant")
    out["reduce_scatter"] = equal_bits(o, oref)
    return out


def check_gather_scatter() -> dict:
    W, r = C.world, C.rank
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = inp(r, 6 * 50, dtype, seed=18, shape=(6, 50))
        for cfg in (None, "bf16"):
            g, ref = (torch.empty(W * 6, 50, dtype=dtype, device=C.device) for _ in range(2))
            comm.all_gather(g, x, cfg)
            dist.all_gather_into_tensor(ref, x)
            big = inp(r, W * 300, dtype, seed=19, shape=(W * 6, 50))
            o, oref, oavg = (torch.empty(6, 50, dtype=dtype, device=C.device) for _ in range(3))
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
        x = inp(r, n, seed=20)
        g = torch.empty(W * n, device=C.device)
        comm.all_gather(g, x, preset)
        ref = torch.cat([inp(q, n, seed=20) for q in range(W)])
        big = inp(r, W * n, seed=21)
        o = torch.empty(n, device=C.device)
        comm.reduce_scatter(o, big, preset)
        out[preset] = {
            "all_gather_nmse": nmse(g, ref),
            "all_gather_identical": identical(g),
            "reduce_scatter_nmse": nmse(o, exact(W * n, seed=21)[r * n : (r + 1) * n]),
        }
    return out


def check_exchange() -> dict:
    """fp4quant.comm.exchange against torch's collectives, on the default group and on a
    subgroup (group ranks are not global ranks), two exchanges in flight at once."""
    from fp4quant.comm import exchange

    out = {}
    groups = [("world", None, list(range(C.world)))]
    if C.world > 2:
        groups.append(("tail", dist.new_group(list(range(1, C.world))), list(range(1, C.world))))
    for name, g, members in groups:
        if C.rank not in members:
            continue
        W = len(members)
        gen = torch.Generator().manual_seed(1000 + C.rank)
        send = torch.randint(0, 256, (W, 1000 + 17 * W), generator=gen, dtype=torch.uint8).to(C.device)
        shard = torch.randint(0, 256, (333,), generator=gen, dtype=torch.uint8).to(C.device)
        recv, gathered = torch.empty_like(send), torch.empty(W * 333, dtype=torch.uint8, device=C.device)
        w1 = exchange.all_to_all(recv, send, group=g, async_op=True)
        w2 = exchange.all_gather(gathered, shard, group=g, async_op=True)
        w1.wait()
        w2.wait()
        ref_recv, ref_gathered = torch.empty_like(send), torch.empty_like(gathered)
        dist.all_to_all_single(ref_recv, send, group=g)
        dist.all_gather_into_tensor(ref_gathered, shard, group=g)
        sync_recv = torch.empty_like(send)
        returned = exchange.all_to_all(sync_recv, send, group=g)
        out[name] = {"all_to_all": torch.equal(recv, ref_recv), "all_gather": torch.equal(gathered, ref_gathered),
                     "sync": torch.equal(sync_recv, ref_recv) and returned is None,
                     "point_to_point": isinstance(w1, exchange.Transfers) and isinstance(w2, exchange.Transfers)}
    # bad input: one line naming the problem, raised before anything is sent (every rank alike)
    u8 = torch.zeros(2 * C.world, dtype=torch.uint8, device=C.device)
    out["errors"] = {
        "scalar": raised(lambda: exchange.all_to_all(u8[:1].view(()), u8[:1].view(()))),
        "dtype": raised(lambda: exchange.all_to_all(u8.float(), u8)),
        "numel": raised(lambda: exchange.all_gather(u8, u8)),
        "noncontiguous": raised(lambda: exchange.all_gather(torch.zeros(2, C.world, dtype=torch.uint8,
                                                                        device=C.device).t(), u8[:2])),
        "rows": raised(lambda: exchange.all_to_all(u8[:1].clone(), u8[:1])) if C.world > 1 else None,
    }
    return out


CHECKS = {name[6:]: fn for name, fn in globals().items() if name.startswith("check_")}


def main() -> int:
    global C
    job = sys.argv[1]
    C = Ctx()
    out_path = sys.argv[2].format(rank=C.rank)
    dist.init_process_group(C.backend, device_id=C.device if C.backend == "nccl" else None)
    results: dict[str, Any] = {"world": C.world, "rank": C.rank}
    names = list(CHECKS) if job == "suite" else job.split(",")
    for name in names:
        try:
            results[name] = CHECKS[name]()
        except Exception:  # noqa: BLE001 - the test reports it
            results[name] = {"error": traceback.format_exc()}
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
