"""The collectives' one seam (fp4quant.comm.hooks): none installed by default, an installed
object told every wire step and codec op of every collective, and no value changed."""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from fp4quant.comm import counters, hooks


class Recording:
    def __init__(self):
        self.wire, self.codec = [], []

    def on_wire(self, steps, intra_node):
        self.wire.append(steps)

    def on_codec(self, op, seconds, values, message_bytes):
        assert seconds >= 0
        self.codec.append((op, values, message_bytes))


def test_none_by_default_and_install_is_checked():
    assert hooks.installed() is None and hooks.describe() is None
    with pytest.raises(TypeError, match="on_wire"):
        hooks.install(object())
    first, second = Recording(), Recording()
    hooks.install(first)
    try:
        hooks.install(first)  # the same object again: a no-op
        with pytest.raises(RuntimeError, match="installed already"):
            hooks.install(second)
        assert hooks.describe() == {"kind": "Recording"}
        with hooks.suspended():
            assert hooks.installed() is None
        assert hooks.installed() is first
    finally:
        hooks.remove()
    assert hooks.installed() is None


def test_a_recorder_tells_the_hooks_installed_when_its_call_began():
    seen = Recording()
    hooks.install(seen)
    try:
        rec = counters.Recorder("t", torch.device("cpu"))
    finally:
        hooks.remove()
    with rec.codec("quantize") as op:
        op.values, op.message_bytes = 10, 7
    rec.wire(3)
    assert seen.codec == [("quantize", 10, 7)] and seen.wire == [3] and rec.wire_steps == 3


def test_every_collective_tells_the_hooks_and_keeps_its_bits():
    for rank in run_ranks("comm._comm_jobs_hooks:told", 2, timeout=120):
        assert rank["same_bits"], rank
        assert rank["wire"] == [1, 1] and rank["codec_ops"] == ["quantize", "dequantize", "dequantize"], rank
        values = rank["values"]
        assert values[0] == values[2] > 0 and values[1] == 0  # encoded, message to message, decoded
