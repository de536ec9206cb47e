"""The codec over float32's whole range, and overflow (docs/format.md, "Decoding").

Finite in, finite out: a finite input never decodes to NaN, whatever its magnitude (the
formats without a coarse scale saturate outside their range); NaN and Inf still decode to
NaN.  One message saturates at the output dtype's maximum; a sum that overflows it is
+-inf, as an uncompressed sum is.  Each check runs on the reference and on ops (the native
kernels where they are built; tests/ops checks that the two agree bit for bit).
"""

from __future__ import annotations

import pytest
import torch

from fp4quant import QuantConfig, ops
from fp4quant.format.config import PRESETS
from fp4quant.reference import codec as reference

COMPRESSED = [p for p in PRESETS if p != "bf16"]
IMPLS = {"reference": reference, "ops": ops}
# largest |x| of a row; 1e-40 and 1e-38 are float32 subnormals and the smallest normals
MAGNITUDES = [1e-40, 1e-38, 1e-30, 1e-10, 1.0, 1e10, 1e30, 1e36, 1e37, 1e38, 3e38]
N = 4096


def rows_of_magnitudes(magnitudes, seed: int) -> torch.Tensor:
    """One row per magnitude: Gaussian values scaled so that the largest is that magnitude."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(magnitudes), N, generator=g, dtype=torch.float64)
    x = x / x.abs().amax(dim=1, keepdim=True) * torch.tensor(magnitudes, dtype=torch.float64)[:, None]
    return x.to(torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", COMPRESSED)
def test_finite_inputs_of_any_magnitude_never_decode_to_nan(name, dtype, impl):
    codec, config = IMPLS[impl], QuantConfig.preset(name)
    x = rows_of_magnitudes(MAGNITUDES, seed=1).to(dtype)
    assert bool(torch.isfinite(x).all())
    msgs = codec.quantize_rows(x, config)
    one = codec.dequantize_rows(msgs, N, config, dtype)
    assert bool(torch.isfinite(one).all()), [m for m, r in zip(MAGNITUDES, one) if not torch.isfinite(r).all()]
    # sums of two messages of the same magnitude, halved so that the exact sum stays in range
    for m, row in zip(MAGNITUDES, x):
        if m > 1e38:
            continue
        half = torch.stack([row.float() / 2, row.float().flip(0) / 2]).to(dtype)
        pair = codec.quantize_rows(half, config)
        values = codec.dequantize_reduce(pair, N, config, dtype, False)
        shard = codec.dequantize_reduce(pair, N, config, dtype, True)
        two_shot = codec.dequantize_rows(shard[None], N, config, dtype, saturate=False)
        assert bool(torch.isfinite(values).all()), (m, "sum")
        assert bool(torch.isfinite(two_shot).all()), (m, "re-quantized sum")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", COMPRESSED)
def test_nan_and_inf_still_decode_to_nan_at_every_magnitude(name, impl):
    codec, config = IMPLS[impl], QuantConfig.preset(name)
    x = rows_of_magnitudes(MAGNITUDES, seed=2)
    x[:, 100] = float("nan")
    x[:, N - 7] = float("-inf")
    unit = config.group if config.fwht != "none" else config.micro_group
    region = torch.zeros(N, dtype=torch.bool)
    for i in (100, N - 7):
        region[i // unit * unit : (i // unit + 1) * unit] = True
    msgs = codec.quantize_rows(x, config)
    for y in (codec.dequantize_rows(msgs, N, config, torch.float32),
              codec.dequantize_reduce(msgs[:2], N, config, torch.float32, False)[None]):
        assert bool(torch.isnan(y[:, region]).all()), "a NaN/Inf micro-group decoded to numbers"
        assert not bool(torch.isinf(y).any())


# --- overflow of the output dtype ---------------------------------------------------------

# single_scale's range ends at 6 * 448 = 2688: it saturates 60000 before any sum
FP16_RANGE = [p for p in COMPRESSED if p != "single_scale"]


def two_ranks(value: float, dtype: torch.dtype) -> torch.Tensor:
    """Two ranks' tensors of +-value (signs alternate by 64 values), as ``dtype``."""
    signs = torch.ones(N).view(-1, 64)
    signs[1::2] = -1.0
    return (value * signs.reshape(-1)).expand(2, N).to(dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", FP16_RANGE)
def test_a_float16_sum_that_overflows_is_inf_like_an_uncompressed_sum(name, impl):
    codec, config = IMPLS[impl], QuantConfig.preset(name)
    x = two_ranks(60000.0, torch.float16)
    exact = x.sum(dim=0)  # what torch (and dist.all_reduce) gives: +-inf
    assert bool(torch.isinf(exact).all())
    msgs = codec.quantize_rows(x, config)
    one_shot = codec.dequantize_reduce(msgs, N, config, torch.float16, False)
    shard = codec.dequantize_reduce(msgs, N, config, torch.float16, True)
    two_shot = codec.dequantize_rows(shard[None], N, config, torch.float16, saturate=False)[0]
    for got in (one_shot, two_shot):
        assert torch.equal(got, exact), f"{int(torch.isfinite(got).sum())} of {N} overflowing sums came back finite"
    # one message never overflows: its input was finite
    assert bool(torch.isfinite(codec.dequantize_rows(msgs, N, config, torch.float16)).all())
    top = two_ranks(65504.0, torch.float16)[:1]
    assert bool(torch.isfinite(codec.dequantize_rows(codec.quantize_rows(top, config), N, config, torch.float16)).all())
    # a sum well inside the range stays finite (near the top, quantization error decides)
    fits = codec.quantize_rows(two_ranks(20000.0, torch.float16), config)
    assert bool(torch.isfinite(codec.dequantize_reduce(fits, N, config, torch.float16, False)).all())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4", "fp8", "naive_pack"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_sum_past_float32_is_inf_not_nan_with_a_coarse_scale(name, dtype, impl):
    # the coarse scale carries the sum's exponent, so even the re-quantized sum holds it
    codec, config = IMPLS[impl], QuantConfig.preset(name)
    x = two_ranks(3e38, dtype)
    msgs = codec.quantize_rows(x, config)
    shard = codec.dequantize_reduce(msgs, N, config, dtype, True)
    for got in (codec.dequantize_reduce(msgs, N, config, dtype, False),
                codec.dequantize_rows(shard[None], N, config, dtype, saturate=False)[0]):
        assert torch.equal(got, x.float().sum(dim=0).to(dtype)), f"{int(torch.isnan(got).sum())} NaN"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_sum_of_one_message_saturates_like_the_message(impl):
    codec, config = IMPLS[impl], QuantConfig.preset("fp4quant")
    msgs = codec.quantize_rows(two_ranks(65504.0, torch.float16)[:1], config)
    assert torch.equal(codec.dequantize_reduce(msgs, N, config, torch.float16, False),
                       codec.dequantize_rows(msgs, N, config, torch.float16)[0])
