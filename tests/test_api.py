"""The public API promised in the README."""

from __future__ import annotations

import torch


def test_public_names():
    from fp4quant import Packed, QuantConfig, dequantize, fwht, ifwht, quantize  # noqa: F401

    x = torch.randn(1000)
    p = quantize(x)
    assert isinstance(p, Packed) and p.config == QuantConfig.preset("fp4quant")
    assert dequantize(p).shape == x.shape
    assert torch.allclose(ifwht(fwht(x, 8), 8), x, atol=1e-6)
