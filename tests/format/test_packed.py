"""Packed: exact wire size, the one-buffer layout, and the float4 view."""

from __future__ import annotations

import pytest
import torch

from fp4quant import Packed, QuantConfig, dequantize, quantize
from fp4quant.format.config import PRESETS
from fp4quant.format.packed import join_messages, layout, slice_messages


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


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**62, 4, 0), (2**63,), (2**64 + 1,), (3, 2**62)])
def test_from_bytes_refuses_a_shape_whose_element_count_overflows(shape):
    # torch.Size.numel() wraps around past int64: (2**40, 2**40) would count 0 values
    empty = torch.empty(0, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"shape \(.*\) is too large") as info:
        Packed.from_bytes(empty, shape, torch.float32, "fp4quant")
    assert str(tuple(shape)) in str(info.value)
    with pytest.raises(ValueError, match="too large"):
        Packed(empty, empty, torch.empty(0), shape, torch.float32, QuantConfig())
    assert Packed.from_bytes(empty, (3, 0, 5), torch.float32, "fp4quant").numel == 0  # zero sizes stay fine


@pytest.mark.parametrize("name", [p for p in PRESETS if p not in ("nvfp4", "bf16")])
def test_slice_and_join_messages_at_block_boundaries(name):
    """A block-aligned piece of a message is the message of that piece's values, and pieces
    join back into the message (the chunked two-shot re-quantizes a shard piece by piece)."""
    config = QuantConfig.preset(name)
    B = config.block
    n = 5 * B + 3
    x = torch.randn(2, n, generator=torch.Generator().manual_seed(0))
    msgs = torch.stack([quantize(row, config).to_bytes() for row in x])
    padded = torch.nn.functional.pad(x, (0, 6 * B - n))
    for a, b in [(0, B), (B, 3 * B), (2 * B, 6 * B), (0, 6 * B), (3 * B, 3 * B)]:
        want = torch.stack([quantize(row[a:b].contiguous(), config).to_bytes() for row in padded])
        assert torch.equal(slice_messages(msgs, n, config, a, b), want), (a, b)
    parts = [slice_messages(msgs, n, config, a, b)[1] for a, b in [(0, B), (B, 3 * B), (3 * B, 6 * B)]]
    assert torch.equal(join_messages(parts, [B, 2 * B, n - 3 * B], config), msgs[1])


def test_slice_messages_refuses_what_is_not_block_local():
    config = QuantConfig.preset("nvfp4")
    with pytest.raises(ValueError, match="per-tensor scale"):
        slice_messages(torch.zeros(1, layout(64, config).nbytes, dtype=torch.uint8), 64, config, 0, 16)
    config = QuantConfig(group=256)
    msgs = torch.zeros(1, layout(512, config).nbytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match="not a multiple of the block"):
        slice_messages(msgs, 512, config, 0, 100)
    with pytest.raises(ValueError, match="not within"):
        slice_messages(msgs, 512, config, 256, 768)


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="torch has no float4_e2m1fn_x2")
def test_codes_are_a_valid_float4_view():
    p = quantize(torch.randn(64), QuantConfig())
    f4 = p.codes.view(torch.float4_e2m1fn_x2)
    assert f4.numel() == p.codes.numel() and torch.equal(f4.view(torch.uint8), p.codes)


def test_repr_mentions_preset_and_size():
    r = repr(quantize(torch.randn(10), QuantConfig.preset("mxfp4")))
    assert "mxfp4" in r and "nbytes=17" in r
