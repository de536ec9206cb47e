"""The public API promised in the README."""

from __future__ import annotations

import pytest
import torch


def test_public_names():
    from fp4quant import Packed, QuantConfig, dequantize, fwht, ifwht, quantize  # noqa: F401

    x = torch.randn(1000)
    p = quantize(x)
    assert isinstance(p, Packed) and p.config == QuantConfig.preset("fp4quant")
    assert dequantize(p).shape == x.shape
    assert torch.allclose(ifwht(fwht(x, 8), 8), x, atol=1e-6)


def test_preset_names_are_accepted_wherever_a_config_is():
    from fp4quant import Packed, QuantConfig, dequantize, ops, quantize
    from fp4quant.reference import codec as reference

    x = torch.randn(3, 700)
    for name in ("fp4quant", "nvfp4", "mxfp4", "fp8"):
        config = QuantConfig.preset(name)
        want = quantize(x, config)
        assert torch.equal(quantize(x, name).to_bytes(), want.to_bytes())
        assert torch.equal(ops.quantize(x, name).to_bytes(), want.to_bytes())
        assert torch.equal(reference.quantize(x, name).to_bytes(), want.to_bytes())
        msgs = ops.quantize_rows(x, name)
        assert torch.equal(msgs, reference.quantize_rows(x, name))
        values = reference.dequantize_rows(msgs, 700, config, torch.float32)
        assert torch.equal(ops.dequantize_rows(msgs, 700, name, torch.float32), values)
        assert torch.equal(reference.dequantize_rows(msgs, 700, name, torch.float32), values)
        assert torch.equal(ops.dequantize_reduce(msgs, 700, name, torch.float32, True),
                           reference.dequantize_reduce(msgs, 700, config, torch.float32, True))
        assert torch.equal(dequantize(Packed.from_bytes(want.to_bytes(), x.shape, x.dtype, name)), dequantize(want))
    with pytest.raises(TypeError, match="config must be a QuantConfig or a preset name"):
        quantize(x, 4)
    with pytest.raises(ValueError, match="unknown preset 'fp5'"):
        ops.quantize_rows(x, "fp5")


def test_packed_rejects_what_would_only_fail_at_dequantize():
    from fp4quant import Packed, QuantConfig, quantize

    p = quantize(torch.randn(5000))
    buf = p.to_bytes()
    with pytest.raises(ValueError, match=r"shape must hold sizes >= 0, got \(-1, -5000\)"):
        Packed.from_bytes(buf, (-1, -5000), torch.float32, QuantConfig())
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):
        Packed.from_bytes(buf, (2.5, 2000), torch.float32, QuantConfig())
    with pytest.raises(TypeError, match="dtype must be float32, bfloat16 or float16"):
        Packed.from_bytes(buf, (5000,), torch.float64, QuantConfig())
    with pytest.raises(TypeError, match="buf must be a 1-D uint8 tensor"):
        Packed.from_bytes(buf.numpy(), (5000,), torch.float32, QuantConfig())
    with pytest.raises(ValueError, match=r"micro_scales must be a 1-D torch.uint8 tensor of 384 entries"):
        Packed(p.codes, p.micro_scales[:-1], p.coarse_scales, p.shape, p.dtype, p.config)
    with pytest.raises(ValueError, match=r"coarse_scales must be a 1-D torch.float32 tensor of 3 entries"):
        Packed(p.codes, p.micro_scales, p.coarse_scales.double(), p.shape, p.dtype, p.config)
    with pytest.raises(ValueError, match=r"codes must be"):
        Packed(p.codes[None], p.micro_scales, p.coarse_scales, p.shape, p.dtype, p.config)
    with pytest.raises(TypeError, match="Packed.config must be a QuantConfig"):
        Packed(p.codes, p.micro_scales, p.coarse_scales, p.shape, p.dtype, "fp4quant")
