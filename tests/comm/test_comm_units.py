"""Single-process pieces of fp4quant.comm: planning, streams, auto thresholds, checks, stats."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from fp4quant.comm import RandomStreams, Wire, auto, counters, derive, mix64, plan, validate
from fp4quant.comm.streams import REQUANT_BIT, CallStreams
from fp4quant.format.config import QuantConfig

def test_shard_values_are_block_multiples_covering_the_tensor():
    for world in (1, 2, 3, 4, 7, 8):
        for block in (16, 32, 2048):
            for n in (1, 17, block, world * block, world * block + 1, 10**6 + 3):
                S = plan.shard_values(n, world, block)
                assert S % block == 0 and world * S >= n
                assert world * S - n < world * block  # at most one padded unit
    assert plan.shard_values(0, 4, 2048) == 0


def test_chunks_tile_the_tensor_on_unit_boundaries():
    assert plan.chunks(0, 8, 100) == []
    assert plan.chunks(50, 8, None) == [plan.Chunk(0, 50)]
    assert plan.chunks(50, 8, 1000) == [plan.Chunk(0, 50)]
    assert plan.chunks(50, 8, 3) == [plan.Chunk(s, min(8, 50 - s)) for s in range(0, 50, 8)]
    cs = plan.chunks(100_003, 4096, 20_000)
    assert all(c.start % 16384 == 0 for c in cs) and sum(c.numel for c in cs) == 100_003
    assert [c.start for c in cs] == list(range(0, 100_003, 16384))
    assert plan.chunk_values(None, 4) is None and plan.chunk_values(1 << 20, 4) == 1 << 18


def test_default_chunk_policy():
    MiB = 1 << 20
    assert plan.default_chunk_bytes(16 * MiB, "cpu") is None
    assert plan.default_chunk_bytes(64 * MiB, "cpu") == 4 * MiB
    assert plan.default_chunk_bytes(256 * MiB, "cpu") == 16 * MiB
    assert plan.default_chunk_bytes(256 * MiB, "cuda") is None
    assert plan.chunk_values("auto", 4, 16 << 20, torch.device("cpu")) == 1 << 20  # 64 MiB of fp32
    assert plan.chunk_values("auto", 2, 1000, torch.device("cpu")) is None


def test_streams_differ_across_calls_ranks_and_phases():
    streams = RandomStreams()
    a0, b0 = streams.next(0), streams.next(0)
    assert a0.seed != b0.seed  # the call counter advances
    assert RandomStreams().next(1).seed == a0.seed  # fresh streams replay from call 0
    assert RandomStreams(5).next(0).seed != a0.seed  # a base seed changes the streams
    assert a0.offset(0) != CallStreams(a0.seed, 1).offset(0)
    assert a0.offset(0, requant=True) - a0.offset(0) == REQUANT_BIT
    assert CallStreams(0, 2**15 - 1).offset(2**46, True) < 2**64
    with pytest.raises(ValueError):
        RandomStreams().next(2**15)


def test_streams_keyed_by_step_replay():
    """A step key restarts the counter: what a resumed run relies on.  The layout is the one the
    committed runs were trained with: call n of step s under seed z is derive(derive(z, s), n)."""
    run = RandomStreams(7)
    run.start_step(3)
    seeds = [run.next(0).seed for _ in range(4)]
    run.start_step(4)
    later = run.next(0).seed
    resumed = RandomStreams(7)
    resumed.start_step(3)
    assert [resumed.next(0).seed for _ in range(4)] == seeds and later not in seeds
    assert seeds[2] == derive(derive(7, 3), 2) == mix64(derive(7, 3) ^ mix64(2 + 0x9E3779B97F4A7C15))
    with pytest.raises(TypeError):
        RandomStreams(1.5)


def test_auto_choice_and_lookup():
    saved = dict(auto.TABLE)
    try:
        auto.set_table({("gloo", 2): auto.Thresholds(1 << 20, 8 << 20), ("gloo", 8): auto.Thresholds(None, None)})
        assert auto.choose(1000, 2, "gloo") == "uncompressed"
        assert auto.choose(1 << 20, 2, "gloo") == "one_shot"
        assert auto.choose(8 << 20, 3, "gloo") == "two_shot"  # nearest measured world size: 2
        assert auto.choose(1 << 30, 7, "gloo") == "uncompressed"  # nearest: 8, never compresses
        assert auto.choose(4, 2, "nccl") == "two_shot"  # unmeasured backend: always compress
    finally:
        auto.TABLE.clear()
        auto.TABLE.update(saved)


def test_thresholds_from_benchmark_rows():
    def rows(config, algorithm, lat_by_size, chunk=""):
        return [
            {"backend": "gloo", "world_size": 2, "config": config, "algorithm": algorithm,
             "chunk_bytes": chunk, "size_bytes": s, "latency_s": t}
            for s, t in lat_by_size.items()
        ]

    sizes = [1 << k for k in range(12, 20, 2)]
    data = (
        rows("none", "ring", dict(zip(sizes, (1.0, 2.0, 4.0, 8.0))))
        + rows("fp4quant", "one_shot", dict(zip(sizes, (3.0, 1.0, 5.0, 7.0))))  # a lone (noisy) win at 16 KiB
        + rows("fp4quant", "two_shot", dict(zip(sizes, (4.0, 5.0, 4.5, 5.0))))
        + rows("fp4quant", "two_shot", dict(zip(sizes, (0.1, 0.1, 0.1, 0.1))), chunk=1 << 20)  # ignored
    )
    t = auto.thresholds_from_rows(data, chunk_policy="none")[("gloo", 2)]
    assert t == auto.Thresholds(compress_min_bytes=1 << 18, two_shot_min_bytes=1 << 16)
    never = auto.thresholds_from_rows(rows("none", "ring", {4096: 1.0}) + rows("fp4quant", "one_shot", {4096: 2.0})
                                      + rows("fp4quant", "two_shot", {4096: 3.0}), chunk_policy="none")
    assert never[("gloo", 2)] == auto.Thresholds(None, None)


def test_wires():
    """Every spelling of "uncompressed" becomes one of two wires, decided in one place."""
    assert Wire.of(None) == Wire.of("exact") == Wire.of("bf16") == Wire.exact()
    assert Wire.of("bf16", uncompressed="cast") == Wire.cast(torch.bfloat16)
    assert Wire.of(None, uncompressed="cast") == Wire.exact()
    assert Wire.of("fp4quant") == Wire("compressed", config=QuantConfig.preset("fp4quant"))
    assert Wire.of(Wire.cast()) == Wire.cast()
    assert Wire.cast().narrows(torch.float32) and not Wire.cast().narrows(torch.bfloat16)
    assert not Wire.cast().narrows(torch.float16) and not Wire.exact().narrows(torch.float32)
    with pytest.raises(ValueError, match="unknown preset"):
        Wire.of("fp3")
    with pytest.raises(TypeError):
        Wire.of(42)
    with pytest.raises(ValueError):
        Wire("compressed", config=QuantConfig.preset("bf16"))
    with pytest.raises(ValueError):
        Wire("cast")
    with pytest.raises(ValueError):
        Wire.of("bf16", uncompressed="drop")


def test_argument_checks():
    stochastic = Wire.of(QuantConfig.preset("fp4quant", rounding="stochastic"))
    with pytest.raises(ValueError, match="random streams"):
        validate.check_streams(stochastic, None)
    with pytest.raises(TypeError):
        validate.check_streams(stochastic, 3)
    validate.check_streams(stochastic, RandomStreams(3))
    validate.check_streams(Wire.of("fp4quant"), None)  # round-to-nearest draws no random numbers
    assert validate.resolve_op("SUM") == "sum" and validate.resolve_op(dist.ReduceOp.AVG) == "avg"
    assert validate.resolve_op("max") == validate.resolve_op(dist.ReduceOp.MAX) == "max"  # uncompressed wires only
    with pytest.raises(ValueError):
        validate.resolve_op("min")
    with pytest.raises(TypeError):
        validate.check_tensor(torch.ones(3, dtype=torch.int8), "tensor", True)
    with pytest.raises(TypeError):
        validate.check_tensor(torch.ones(3, dtype=torch.float64), "tensor", True)
    validate.check_tensor(torch.ones(3, dtype=torch.float64), "tensor", False)
    with pytest.raises(ValueError):
        validate.check_chunk_bytes(0)
    a = validate.record("all_reduce", QuantConfig(), tensor=torch.ones(3), op="sum")
    b = validate.record("all_reduce", QuantConfig(group=256), tensor=torch.ones(3), op="sum")
    assert validate._difference(a, a) is None
    assert validate._difference(a, b).startswith("config.group: 256")


def test_stats_recorder(monkeypatch):
    clock = [100.0]  # the recorder's clock, advanced by hand: exact times, whatever the load

    def elapse(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(counters, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    counters.reset_stats()
    rec = counters.Recorder("fwd", torch.device("cpu"))
    with rec.codec("quantize"):
        elapse(0.002)
    with rec.codec("dequantize"):
        elapse(0.001)
    with rec.codec("dequantize"):
        pass
    with rec.comm():
        pass
    with pytest.raises(ValueError, match="codec op"):
        with rec.codec("reduce"):
            pass
    rec.bytes_sent, rec.bytes_uncompressed = 10, 40
    rec.commit()
    s = counters.stats()
    assert s["fwd"]["calls"] == 1 and s["fwd"]["bytes_sent"] == 10 and s["fwd"]["bytes_uncompressed"] == 40
    # the split timers: each op's time in its own field, the codec total their sum
    assert s["fwd"]["quantize_s"] == pytest.approx(0.002) and s["fwd"]["dequantize_s"] == pytest.approx(0.001)
    assert s["fwd"]["codec_s"] == pytest.approx(s["fwd"]["quantize_s"] + s["fwd"]["dequantize_s"], rel=1e-12)
    assert s["fwd"]["total_s"] == pytest.approx(0.003)
    assert counters.traffic() == {"fwd": {"calls": 1, "bytes_sent": 10, "bytes_uncompressed": 40},
                                  "bwd": {"calls": 0, "bytes_sent": 0, "bytes_uncompressed": 0}}
    s["fwd"]["calls"] = 99  # a copy
    assert counters.stats()["fwd"]["calls"] == 1
    counters.reset_stats()
    assert counters.stats() == {}


def test_the_recorder_keeps_its_spans_once_taken(monkeypatch):
    clock = [10.0]
    monkeypatch.setattr(counters, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(counters._COUNTERS, "keep_spans", False)
    counters.reset_stats()

    def call(key: str, parts: list[float]) -> None:
        rec = counters.Recorder(key, torch.device("cpu"))
        for seconds in parts:
            with rec.comm():
                clock[0] += seconds
            clock[0] += 1.0  # codec, compute: outside the spans
        rec.commit()

    call("fwd", [0.5])
    assert counters.take_spans() == {}  # nothing kept before the first take: callers that never take them
    call("fwd", [0.25, 0.125])
    call("bwd", [2.0])
    call("fwd", [0.5])
    assert counters.stats()["fwd"]["comm_s"] == pytest.approx(0.5 + 0.25 + 0.125 + 0.5)
    assert counters.take_spans() == {"fwd": [(11.5, 11.75), (12.75, 12.875), (16.875, 17.375)],
                                      "bwd": [(13.875, 15.875)]}
    assert counters.take_spans() == {}  # taken: cleared
    call("fwd", [1.0])
    counters.reset_stats()
    assert counters.take_spans() == {}
    counters.reset_stats()


def test_each_thread_counts_its_own_calls():
    """A simulated rank (a thread) logs its own traffic, not the sum over the ranks."""
    import threading

    counters.reset_stats()
    seen = {}

    def rank(n: int) -> None:
        for _ in range(n):
            counters.Recorder("fwd", torch.device("cpu")).commit()
        seen[n] = counters.stats()["fwd"]["calls"]

    threads = [threading.Thread(target=rank, args=(n,)) for n in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {2: 2, 3: 3}
    assert counters.stats() == {}  # this thread's: untouched
