"""Checks of the suite on the library's contract rather than its numbers: argument and
cross-rank validation, traffic accounting, the automatic algorithm choice, and the byte
exchange under the collectives.  Each takes the rank and returns its record (_comm_jobs.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import fp4quant.comm as comm
import fp4quant.comm.validate as vd
from fp4quant.format.config import QuantConfig
from fp4quant.format.packed import layout

from _comm_rank import BLOCK, Rank, equal_bits, identical, raised


def check_validation(ctx: Rank) -> dict:
    W, last = ctx.world, ctx.world - 1
    out: dict[str, Any] = {}
    calls = {"n": 0}
    real = vd.exchange

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    vd.exchange = counting
    try:
        y = ctx.inp(ctx.rank, 3000)
        comm.all_reduce(y, "fp4quant")
        out["fast_path_exchanges"] = calls["n"]
        out["ok"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 3000), "fp4quant", validate=True))
        out["validated_exchanges"] = calls["n"]
    finally:
        vd.exchange = real
    dtype = torch.float16 if ctx.rank == last and W > 1 else torch.float32
    out["dtype"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 3000, dtype), "fp4quant", validate=True))
    cfg = QuantConfig.preset("fp4quant", group=256 if ctx.rank == last and W > 1 else BLOCK)
    out["config"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 3000), cfg, validate=True))
    op = "avg" if ctx.rank == last and W > 1 else "sum"
    out["op"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 3000), "fp4quant", op=op, validate=True))
    n = 3001 if ctx.rank == last and W > 1 else 3000
    out["shape"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, n), "fp4quant", validate=True))
    # the same messages in another order: equal-size chunks of two phases would be swapped silently
    overlap = not (ctx.rank == last and W > 1)
    out["overlap"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 40000), "fp4quant", chunk_bytes=16384, overlap=overlap,
                                                    validate=True))
    x = torch.ones(3000, dtype=torch.int64) if ctx.rank == last else ctx.inp(ctx.rank, 3000)
    out["int_validated"] = raised(lambda: comm.all_reduce(x, "fp4quant", validate=True))
    o = torch.empty(W * (10 if ctx.rank == last and W > 1 else 11), device=ctx.device)
    out["gather_shape"] = raised(lambda: comm.all_gather(o, ctx.inp(ctx.rank, 11), "fp4quant", validate=True))
    e = torch.empty(0, device=ctx.device) if ctx.rank != last or W == 1 else ctx.inp(ctx.rank, 5)
    out["empty_vs_nonempty"] = raised(lambda: comm.all_reduce(e, "fp4quant", validate=True))
    sr = QuantConfig.preset("fp4quant", rounding="stochastic")
    out["stochastic_without_streams"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 10), sr))
    # argument errors on every rank, before any communication
    out["int"] = raised(lambda: comm.all_reduce(torch.ones(10, dtype=torch.int32), "fp4quant"))
    out["int_uncompressed"] = raised(lambda: comm.all_reduce(torch.ones(10, dtype=torch.int32)))
    out["bad_op"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 10), "fp4quant", op="max"))
    out["bad_algorithm"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 10), "fp4quant", algorithm="ring"))
    out["bad_rs_shape"] = raised(lambda: comm.reduce_scatter(torch.empty(3), ctx.inp(ctx.rank, 3 * W + 1), "fp4quant"))
    y = ctx.inp(ctx.rank, 100)
    comm.all_reduce(y, "fp4quant")  # still in step after all that
    out["in_step"] = identical(y)
    # validate=True on the last rank only (in a group of its own: the failed call leaves that
    # group's validation sequence one apart, as a fatal error would): it waits, then names the others
    group = dist.new_group(list(range(W)))
    if ctx.rank == last:
        timeout, vd.VALIDATION_TIMEOUT_S = vd.VALIDATION_TIMEOUT_S, 2.0
        try:
            out["validated_alone"] = raised(lambda: comm.all_reduce(ctx.inp(ctx.rank, 100), "fp4quant", group=group,
                                                                    validate=True))
        finally:
            vd.VALIDATION_TIMEOUT_S = timeout
    dist.barrier()
    return out


def check_stats(ctx: Rank) -> dict:
    W = ctx.world
    comm.reset_stats()
    n = 4 * W * BLOCK
    comm.all_reduce(ctx.inp(ctx.rank, n), "fp4quant", algorithm="two_shot", stats_key="fwd")
    comm.all_reduce(ctx.inp(ctx.rank, n), "fp4quant", algorithm="one_shot", stats_key="bwd")
    comm.all_reduce(ctx.inp(ctx.rank, n), None, stats_key="bwd")
    comm.all_reduce(ctx.inp(ctx.rank, 0), "fp4quant", stats_key="bwd")
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


def check_auto(ctx: Rank) -> dict:
    from fp4quant.comm import auto

    out = {}
    y, ref = ctx.inp(ctx.rank, 70000, seed=13), ctx.inp(ctx.rank, 70000, seed=13)
    dist.all_reduce(ref)
    comm.all_reduce(y, "fp4quant", algorithm="auto")
    out["table_choice"] = auto.choose(70000 * 4, ctx.world, ctx.backend)
    out["default_table"] = equal_bits(y, ref) if out["table_choice"] == "uncompressed" else identical(y)
    saved = dict(auto.TABLE)
    try:
        comm.set_table({(ctx.backend, ctx.world): comm.Thresholds(16384, 262144)})
        for n, expect in ((512, None), (4096, "one_shot"), (65536, "two_shot")):
            y = ctx.inp(ctx.rank, n, seed=14)
            comm.all_reduce(y, "fp4quant", algorithm="auto")
            ref = ctx.inp(ctx.rank, n, seed=14)
            if expect is None:
                dist.all_reduce(ref)
            else:
                comm.all_reduce(ref, "fp4quant", algorithm=expect)
            out[f"set_table/{n}"] = equal_bits(y, ref)
    finally:
        auto.TABLE.clear()
        auto.TABLE.update(saved)
    return out


def check_exchange(ctx: Rank) -> dict:
    """fp4quant.comm.exchange against torch's collectives, on the default group and on a
    subgroup (group ranks are not global ranks), two exchanges in flight at once."""
    from fp4quant.comm import exchange

    out = {}
    groups = [("world", None, list(range(ctx.world)))]
    if ctx.world > 2:
        groups.append(("tail", dist.new_group(list(range(1, ctx.world))), list(range(1, ctx.world))))
    for name, g, members in groups:
        if ctx.rank not in members:
            continue
        W = len(members)
        gen = torch.Generator().manual_seed(1000 + ctx.rank)
        send = torch.randint(0, 256, (W, 1000 + 17 * W), generator=gen, dtype=torch.uint8).to(ctx.device)
        shard = torch.randint(0, 256, (333,), generator=gen, dtype=torch.uint8).to(ctx.device)
        recv, gathered = torch.empty_like(send), torch.empty(W * 333, dtype=torch.uint8, device=ctx.device)
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
    u8 = torch.zeros(2 * ctx.world, dtype=torch.uint8, device=ctx.device)
    out["errors"] = {
        "scalar": raised(lambda: exchange.all_to_all(u8[:1].view(()), u8[:1].view(()))),
        "dtype": raised(lambda: exchange.all_to_all(u8.float(), u8)),
        "numel": raised(lambda: exchange.all_gather(u8, u8)),
        "noncontiguous": raised(lambda: exchange.all_gather(torch.zeros(2, ctx.world, dtype=torch.uint8,
                                                                        device=ctx.device).t(), u8[:2])),
        "rows": raised(lambda: exchange.all_to_all(u8[:1].clone(), u8[:1])) if ctx.world > 1 else None,
    }
    return out
