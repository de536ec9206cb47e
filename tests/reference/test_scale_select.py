"""4-over-6 micro-scale selection: the existing wire format and decoder, never a worse micro-group."""

from __future__ import annotations

import pytest
import torch

from fp4quant import QuantConfig, dequantize
from fp4quant.format.packed import Packed
from fp4quant.reference import codec, scale_select


def gaussian(n=8192, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def per_micro_error(approx, x, micro):
    return ((approx.double() - x.double()) ** 2).view(-1, micro).sum(dim=1)


@pytest.mark.parametrize("config", [QuantConfig.preset("no_fwht"), QuantConfig.preset("nvfp4"),
                                    QuantConfig.preset("no_fwht", group=128, coarse_scale="none")], ids=str)
def test_never_worse_per_micro_group_and_decodes_with_the_existing_decoder(config):
    x = gaussian() * torch.logspace(-3, 3, 8192)  # micro-groups of every magnitude
    default = codec.quantize(x, config)
    packed, four = scale_select.select(x, config)
    # the same layout: the bytes parse back as a message of this config
    raw = packed.to_bytes()
    assert raw.numel() == default.to_bytes().numel()
    again = Packed.from_bytes(raw, x.shape, x.dtype, config)
    assert torch.equal(dequantize(again), dequantize(packed))
    assert torch.equal(packed.coarse_scales, default.coarse_scales)
    e_default = per_micro_error(dequantize(default), x, config.micro_group)
    e_select = per_micro_error(dequantize(packed), x, config.micro_group)
    assert (e_select <= e_default).all()
    assert 0.05 < four.float().mean() < 0.95  # both choices occur on Gaussian data
    assert e_select.sum() < 0.95 * e_default.sum()
    # a micro-group that kept the default is the default, byte for byte
    keep = ~four
    assert torch.equal(packed.micro_scales[keep], default.micro_scales[keep])
    assert torch.equal(packed.codes.view(keep.numel(), -1)[keep], default.codes.view(keep.numel(), -1)[keep])


def test_with_the_fwht_the_total_error_is_not_worse():
    config = QuantConfig.preset("fp4quant")
    x = gaussian(16384, 1)
    e_default = float(((dequantize(codec.quantize(x, config)) - x) ** 2).sum())
    e_select = float(((dequantize(scale_select.quantize(x, config)) - x) ** 2).sum())
    assert e_select < e_default * (1 + 1e-5)


def test_non_finite_micro_groups_stay_nan_and_bad_configs_are_refused():
    config = QuantConfig.preset("no_fwht")
    x = gaussian(4096, 2)
    x[5] = float("inf")
    y = dequantize(scale_select.quantize(x, config))
    assert torch.isnan(y[:16]).all() and torch.isfinite(y[16:]).all()
    assert scale_select.quantize(torch.empty(0), config).layout.padded == 0
    for bad in (QuantConfig.preset("int4"), QuantConfig.preset("mxfp4"), config.replace(rounding="stochastic"),
                QuantConfig.preset("fp8")):
        with pytest.raises(ValueError, match="4-over-6"):
            scale_select.select(x, bad)
    with pytest.raises(TypeError):
        scale_select.select([1.0], config)
