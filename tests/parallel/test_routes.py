"""A TPCommunicator resolves each direction once, when built, to a route: the one
fp4quant.comm.Options of its collectives (wire, stats key, the CommConfig's options)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fp4quant.comm import Options, Wire
from fp4quant.format.config import QuantConfig
from fp4quant.parallel import CommConfig, Route, TPCommunicator


def routes(preset, compress="both", **kw):
    tp = TPCommunicator(None, CommConfig.from_preset(preset, compress, **kw))
    return tp.routes["fwd"], tp.routes["bwd"]


def wires(preset, compress="both", **kw):
    return tuple((r.wire, r.stats_key) for r in routes(preset, compress, **kw))


def test_every_spelling_of_uncompressed_is_one_of_two_wires():
    assert wires("exact") == ((Wire.exact(), "fwd"), (Wire.exact(), "bwd"))
    assert wires("bf16") == ((Wire.cast(torch.bfloat16), "fwd"), (Wire.cast(torch.bfloat16), "bwd"))
    assert routes("fp4quant", "none") == routes("bf16")


def test_a_route_carries_the_configs_options_once_built():
    fwd, _ = routes("fp4quant", algorithm="one_shot", chunk_bytes=4096, overlap=False)
    assert isinstance(fwd, Route) and fwd.options == Options(Wire.of("fp4quant"), algorithm="one_shot",
                                                             chunk_bytes=4096, overlap=False, stats_key="fwd")
    assert fwd.validating == dataclasses.replace(fwd.options, validate=True)


def test_compressed_directions():
    fp4 = QuantConfig.preset("fp4quant")
    fwd, bwd = wires("fp4quant")
    assert fwd == (Wire.of(fp4), "fwd") and bwd == (Wire.of(fp4.replace(rounding="stochastic")), "bwd")
    fwd, bwd = routes("fp4quant", "bwd", stochastic_backward=False)
    assert fwd.wire == Wire.cast() and bwd.wire == Wire.of(fp4)


def test_streams_are_the_communicators_and_keyed_by_step():
    tp = TPCommunicator(None, CommConfig(seed=5))
    tp.start_step(2)
    first = tp.streams.next(0).seed
    other = TPCommunicator(None, CommConfig(seed=5))
    other.start_step(2)
    assert other.streams.next(0).seed == first  # nothing global: a second communicator replays
    tp.start_step(2, validate=True)
    assert tp.validate and tp.streams.next(0).seed == first
    tp.start_step(3)
    assert not tp.validate


def test_an_unknown_direction_is_refused():
    tp = TPCommunicator.virtual_group(2)
    with pytest.raises(RuntimeError):
        tp.all_reduce(torch.ones(2), "fwd")
    tp = TPCommunicator(None)
    tp.world = 2  # as if in a group: the direction is checked before anything is sent
    with pytest.raises(ValueError, match="direction"):
        tp.all_reduce(torch.ones(2), "sideways")
