"""The emulated cluster's time dilation (fp4quant.cluster.dilation), installed as the
collectives' hooks: off by default, a sleep per wire step's latency, codec ops stretched and
never shortened, bad values refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from distributed import run_ranks
from fp4quant.cluster import dilation as dilation_module
from fp4quant.cluster import rank as cluster_rank
from fp4quant.cluster.dilation import Dilation
from fp4quant.comm import counters, hooks


def test_off_by_default_and_outside_the_cluster(monkeypatch):
    assert not Dilation().active and Dilation().codec_target_s(10**9) == 0.0
    monkeypatch.delenv("FP4QUANT_CLUSTER_LATENCY_S", raising=False)
    monkeypatch.delenv("FP4QUANT_CLUSTER_CODEC_BPS", raising=False)
    assert cluster_rank.dilation_from_env() == Dilation()


def test_the_cluster_runner_variables_reach_the_dilation(monkeypatch):
    monkeypatch.setenv("FP4QUANT_CLUSTER_LATENCY_S", "0.0665")
    monkeypatch.setenv("FP4QUANT_CLUSTER_CODEC_BPS", "3.5e8")
    assert cluster_rank.dilation_from_env() == Dilation(0.0665, 3.5e8)
    assert Dilation(0.0, 1e6).codec_target_s(2000) == pytest.approx(2e-3)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "fast", "1e400"])
@pytest.mark.parametrize("name", ["FP4QUANT_CLUSTER_LATENCY_S", "FP4QUANT_CLUSTER_CODEC_BPS"])
def test_bad_variables_are_refused_in_one_line(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as e:
        cluster_rank.dilation_from_env()
    msg = str(e.value)
    assert "\n" not in msg and name in msg and repr(value) in msg


@pytest.mark.parametrize("field", ["latency_s", "codec_bytes_per_s"])
@pytest.mark.parametrize("value", [-1e-3, math.nan, math.inf, "1"])
def test_bad_fields_are_refused_in_one_line(field, value):
    with pytest.raises(ValueError) as e:
        Dilation(**{field: value})
    assert "\n" not in str(e.value) and field in str(e.value)


def recorder_under(dilation: Dilation) -> counters.Recorder:
    hooks.install(dilation)
    try:
        return counters.Recorder("t", torch.device("cpu"))
    finally:
        hooks.remove()


def test_a_stretched_codec_op_lasts_its_target_and_counts_as_codec_time():
    """Real sleeps: a lower bound only (a sleep never ends early), never an upper one."""
    dilation = Dilation(codec_bytes_per_s=1e6)
    rec = recorder_under(dilation)
    with rec.codec("quantize") as op:
        op.message_bytes = 200_000  # 200 ms at 1 MB/s: far longer than a preempted empty block
    assert rec.quantize_s >= 0.2 and 0 < dilation.slept["codec_stretch_s"] <= 0.2
    assert dilation.slept["codec_unstretched"] == 0


def test_the_target_counts_values_at_bf16_and_messages_at_their_bytes(monkeypatch):
    slept = []
    monkeypatch.setattr(dilation_module.Dilation, "sleep", staticmethod(slept.append))
    Dilation(codec_bytes_per_s=1e3).on_codec("quantize", 0.0, values=1000, message_bytes=500)
    assert slept == [pytest.approx((2 * 1000 + 500) / 1e3)]


def test_an_op_slower_than_its_target_is_left_alone_and_counted(monkeypatch):
    slept = []
    monkeypatch.setattr(dilation_module.Dilation, "sleep", staticmethod(slept.append))
    dilation = Dilation(codec_bytes_per_s=1e18)
    rec = recorder_under(dilation)
    with rec.codec("quantize") as op:
        op.message_bytes = 1000
    assert slept == [] and dilation.slept["codec_unstretched"] == 1 and dilation.slept["codec_stretch_s"] == 0.0
    plain = counters.Recorder("t", torch.device("cpu"))
    with plain.codec("quantize") as op:
        op.message_bytes = 1000
    plain.wire(6)
    assert slept == [] and plain.wire_steps == 6


# wire steps of each collective at world W: a ring all-reduce and the two-shot 2 (W-1), the
# rest W-1; sleeps: one per collective issued (the two-shot issues 2 per chunk)
def expected(world: int) -> dict[str, tuple[int, int]]:
    w = world - 1
    return {"plain_all_reduce": (1, 2 * w), "cast_all_reduce": (1, 2 * w), "two_shot": (2, 2 * w),
            "two_shot_4_chunks": (8, 8 * w), "one_shot": (1, w), "plain_all_gather": (1, w), "all_gather": (1, w),
            "plain_reduce_scatter": (1, w), "reduce_scatter": (1, w), "exact_of_communicator": (1, w)}


@pytest.mark.parametrize("world", [2, 3])
def test_each_collective_sleeps_its_wire_steps_latency(world):
    for rank in run_ranks("cluster._dilation_jobs:latency_steps", world, timeout=240):
        for name, (sleeps, steps) in expected(world).items():
            got = rank[f"{name}/dilated"]
            assert (got["sleeps"], got["steps"]) == (sleeps, steps), (name, got)
            assert got["wire_steps"] == steps, (name, got)
            default = rank[f"{name}/default"]
            assert default["sleeps"] == 0 and default["steps"] == 0, (name, default)


def test_codec_stretch_never_shortens_and_changes_no_value():
    for rank in run_ranks("cluster._dilation_jobs:codec_stretch", 2, timeout=240):
        slow, fast = rank["slow"], rank["fast"]
        assert len(slow["sleeps"]) == 3 and all(s > 0 for s in slow["sleeps"])  # quantize, reduce, decode
        assert slow["stretch_s"] == pytest.approx(sum(slow["sleeps"])) and slow["unstretched"] == 0
        assert fast["sleeps"] == [] and fast["unstretched"] == 3 and fast["stretch_s"] == 0.0
        assert slow["same_bits"] and fast["same_bits"]
        assert slow["wire_steps"] == fast["wire_steps"] == 2


def test_steps_inside_a_node_sleep_no_inter_node_latency(monkeypatch):
    slept = []
    monkeypatch.setattr(dilation_module.Dilation, "sleep", staticmethod(slept.append))
    d = Dilation(latency_s=0.5)
    d.on_wire(3, intra_node=True)
    assert slept == []
    d.on_wire(3, intra_node=False)
    assert slept == [1.5] and d.slept["wire_steps"] == 3
