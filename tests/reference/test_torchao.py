"""nvfp4 and mxfp4 presets against torchao, the ecosystem's reference, bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch

from fp4quant import QuantConfig, dequantize, quantize

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")


def random_rows(gen, rows=64, cols=256) -> torch.Tensor:
    """Rows of very different magnitudes, with outliers: blocks hit both scale clamps."""
    mag = torch.pow(10.0, torch.randint(-8, 9, (rows, 1), generator=gen).float())
    x = torch.randn(rows, cols, generator=gen) * mag
    x[torch.rand(rows, cols, generator=gen) < 0.002] *= 300
    return x


def adversarial_rows(gen) -> torch.Tensor:
    """Values at and next to the E2M1 rounding ties, on-grid values, zeros, signed zeros."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    near = torch.cat([ties, torch.nextafter(ties, torch.zeros(1)), torch.nextafter(ties, torch.full((1,), 9.0))])
    rows = []
    for k in range(-6, 7):
        scale = 2.0**k
        vals = near[torch.randint(0, len(near), (16,), generator=gen)]
        vals[0] = 6.0  # block amax exactly 6 * 2**k: scale exactly 2**k / per-tensor scale
        sign = torch.where(torch.rand(16, generator=gen) < 0.5, -1.0, 1.0)
        rows.append(vals * sign * scale)
    block = torch.stack(rows)
    zeros = torch.zeros(2, 16)
    zeros[1, ::2] = -0.0
    tiny = torch.full((1, 16), 1e-12)
    return torch.cat([block, zeros, tiny]).reshape(-1, 32)


def nvfp4_torchao(x: torch.Tensor):
    amax = x.abs().max().float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=amax / 2688)
    return t.qdata.view(torch.uint8).reshape(-1), t.scale.view(torch.uint8).reshape(-1), t.per_tensor_scale


def check_nvfp4(x: torch.Tensor) -> None:
    codes, scales, tensor_scale = nvfp4_torchao(x)
    p = quantize(x, QuantConfig.preset("nvfp4"))
    assert torch.equal(p.codes, codes)
    assert torch.equal(p.micro_scales, scales)
    assert torch.equal(p.coarse_scales.reshape(()), tensor_scale.float().reshape(()))


def check_mxfp4(x: torch.Tensor) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scale, data = mx.to_mx(x, torch.float4_e2m1fn_x2, 32)
    p = quantize(x, QuantConfig.preset("mxfp4"))
    assert torch.equal(p.codes, data.view(torch.uint8).reshape(-1))
    assert torch.equal(p.micro_scales, scale.view(torch.uint8).reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("trial", range(5))
def test_nvfp4_random(dtype, trial):
    check_nvfp4(random_rows(torch.Generator().manual_seed(trial)).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("trial", range(5))
def test_mxfp4_random(dtype, trial):
    check_mxfp4(random_rows(torch.Generator().manual_seed(100 + trial)).to(dtype))


@pytest.mark.parametrize("trial", range(3))
def test_nvfp4_adversarial(trial):
    g = torch.Generator().manual_seed(200 + trial)
    x = adversarial_rows(g)
    check_nvfp4(x)
    # and with a tensor scale that is exactly 1 (amax 2688): block scales exactly 2**k
    y = x.clone()
    y[0, 0] = 2688.0
    check_nvfp4(y)


@pytest.mark.parametrize("trial", range(3))
def test_mxfp4_adversarial(trial):
    check_mxfp4(adversarial_rows(torch.Generator().manual_seed(300 + trial)))


def test_mxfp4_tiny_blocks_use_the_scale_their_byte_stands_for():
    # torchao divides by 2**-126 when the scale byte is 0 (amax < 2**-125); fp4quant
    # uses 2**-127, the byte's value, so decoding is consistent (documented in docs/format.md).
    x = torch.full((32,), 3 * 2.0**-128)
    y = dequantize(quantize(x, QuantConfig.preset("mxfp4")))
    assert torch.equal(y, x)
