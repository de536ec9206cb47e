"""Packed: exact wire size, the one-buffer layout, and the float4 view."""

from __future__ import annotations

import pytest
import torch

from fp4quant import Packed, QuantConfig, dequantize, quantize
from fp4quant.format.config import PRESETS
from fp4quant.format.packed import layout


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("numel", [0, 1, 15, 16, 17, 255, 256, 1000, 4096])
def test_nbytes_is_the_size_of_to_bytes(name, numel):
    config = QuantConfig.preset(name)
    p = quantize(torch.randn(numel), config)
    assert p.to_bytes().numel() == p.nbytes == layout(numel, config).nbytes


@pytest.mark.parametrize(
    "name, numel, nbytes",
    [
        ("fp4quant", 2048, 4 + 128 + 1024),
        ("fp4quant", 2049, 2 * (4 + 128 + 1024)),
        ("nvfp4", 16, 4 + 1 + 8),
        ("nvfp4", 33, 4 + 3 + 24),
        ("mxfp4", 32, 1 + 16),
        ("int4", 32, 2 + 16),
        ("fp8", 2048, 4 + 2048),
        ("bf16", 5, 10),
        ("fp4quant", 0, 0),
    ],
)
def test_nbytes_by_hand(name, numel, nbytes):
    # fp4quant pads to its group (2048 by default): 4-byte coarse scale, 1-byte micro-scales, nibbles
    assert quantize(torch.ones(numel), QuantConfig.preset(name)).nbytes == nbytes


def test_fp4quant_bits_per_value_on_the_wire_large_message():
    n = 1 << 20
    p = quantize(torch.randn(n), QuantConfig())
    assert 8 * p.nbytes / n <= 4.7
    assert 2 * n / p.nbytes >= 3.4


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_to_bytes_from_bytes_round_trip(name, dtype):
    config = QuantConfig.preset(name)
    x = torch.randn(3, 97).to(dtype)
    p = quantize(x, config)
    buf = p.to_bytes()
    q = Packed.from_bytes(buf, x.shape, dtype, config)
    for field in ("codes", "micro_scales", "coarse_scales"):
        assert torch.equal(getattr(q, field), getattr(p, field)), field
    assert torch.equal(dequantize(q), dequantize(p))
    assert q.shape == x.shape and q.dtype == dtype


def test_from_bytes_at_unaligned_offset():
    config = QuantConfig.preset("int4")
    x = torch.randn(100)
    buf = quantize(x, config).to_bytes()
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), buf])[1:]
    assert torch.equal(dequantize(Packed.from_bytes(shifted, x.shape, x.dtype, config)), dequantize(quantize(x, config)))


def test_segment_order_coarse_micro_codes():
    x = torch.randn(512)
    p = quantize(x, QuantConfig(group=256))
    buf = p.to_bytes()
    assert torch.equal(buf[:8].view(torch.float32), p.coarse_scales)
    assert torch.equal(buf[8 : 8 + 32], p.micro_scales)
    assert torch.equal(buf[40:], p.codes)


def test_from_bytes_rejects_wrong_size_and_type():
    config = QuantConfig(group=256)
    buf = quantize(torch.randn(256), config).to_bytes()
    with pytest.raises(ValueError, match="holds 147 bytes"):
        Packed.from_bytes(buf[:-1], (256,), torch.float32, config)
    with pytest.raises(TypeError, match="uint8"):
        Packed.from_bytes(buf.float(), (256,), torch.float32, config)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        Packed.from_bytes(buf, (256,), torch.int32, config)


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="torch has no float4_e2m1fn_x2")
def test_codes_are_a_valid_float4_view():
    p = quantize(torch.randn(64), QuantConfig())
    f4 = p.codes.view(torch.float4_e2m1fn_x2)
    assert f4.numel() == p.codes.numel() and torch.equal(f4.view(torch.uint8), p.codes)


def test_repr_mentions_preset_and_size():
    r = repr(quantize(torch.randn(10), QuantConfig.preset("mxfp4")))
    assert "mxfp4" in r and "nbytes=17" in r
