"""A TPCommunicator resolves each direction once, when built, to a (wire, stats key) route."""

from __future__ import annotations

import pytest
import torch

from fp4quant.comm import Wire
from fp4quant.format.config import QuantConfig
from fp4quant.parallel import CommConfig, Route, TPCommunicator


def routes(preset, compress="both", **kw):
    tp = TPCommunicator(None, CommConfig.from_preset(preset, compress, **kw))
    return tp.routes["fwd"], tp.routes["bwd"]


def test_every_spelling_of_uncompressed_is_one_of_two_wires():
    assert routes("exact") == (Route(Wire.exact(), "fwd"), Route(Wire.exact(), "bwd"))
    assert routes("bf16") == (Route(Wire.cast(torch.bfloat16), "fwd"), Route(Wire.cast(torch.bfloat16), "bwd"))
    assert routes("fp4quant", "none") == routes("bf16")


def test_compressed_directions():
    fp4 = QuantConfig.preset("fp4quant")
    fwd, bwd = routes("fp4quant")
    assert fwd == Route(Wire.of(fp4), "fwd") and bwd == Route(Wire.of(fp4.replace(rounding="stochastic")), "bwd")
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
