"""The reference codec: round trips, sizes, dtypes, non-finite and extreme inputs, stochastic rounding."""

from __future__ import annotations

import pytest
import torch

from helpers import DTYPES, nmse
from fp4quant import QuantConfig, dequantize, ops, quantize
from fp4quant.format.config import PRESETS
from fp4quant.reference import codec
from fp4quant.reference import quantize as reference_quantize

COMPRESSED = [p for p in PRESETS if p != "bf16"]
# NMSE of one quantize -> dequantize of a standard Gaussian (measured ~0.009 for the
# FP4 presets, ~0.014 for mxfp4, ~7e-4 for fp8): bounds with headroom.
GAUSSIAN_NMSE = {"fp8": 2e-3, "bf16": 1e-5, "mxfp4": 0.02}


def gaussian_bound(name: str) -> float:
    return GAUSSIAN_NMSE.get(name, 0.012)


def round_trip(x, config):
    return dequantize(quantize(x, config))


# --- shapes, sizes, dtypes ----------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("numel", [1, 15, 17, 1000])
def test_odd_sizes_all_dtypes(name, dtype, numel, gen):
    x = torch.randn(numel, generator=gen).to(dtype)
    y = round_trip(x, QuantConfig.preset(name))
    assert y.shape == x.shape and y.dtype == dtype
    assert bool(torch.isfinite(y).all())
    if numel >= 1000:
        assert nmse(y, x) < gaussian_bound(name) + (0.004 if dtype != torch.float32 else 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_odd_size(name, dtype, gen):
    x = torch.randn(1000003, generator=gen).to(dtype)
    y = round_trip(x, QuantConfig.preset(name))
    assert y.shape == x.shape and y.dtype == dtype
    assert nmse(y, x) < gaussian_bound(name) + (0.004 if dtype != torch.float32 else 0)


def test_multidimensional_and_non_contiguous(gen):
    x = torch.randn(33, 65, generator=gen)
    config = QuantConfig()
    y = round_trip(x.t(), config)
    assert y.shape == (65, 33)
    assert torch.equal(y, round_trip(x.t().contiguous(), config))


def test_empty():
    for name in PRESETS:
        p = quantize(torch.empty(0, 3), QuantConfig.preset(name))
        assert p.nbytes == 0 and dequantize(p).shape == (0, 3)


def test_bad_inputs():
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize(torch.arange(10), QuantConfig())
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize([1.0, 2.0], QuantConfig())
    with pytest.raises(ValueError, match="seed"):
        reference_quantize(torch.randn(4), QuantConfig(), seed=-1)


def test_bf16_preset_is_a_plain_cast(gen):
    x = torch.randn(100, generator=gen)
    assert torch.equal(round_trip(x, QuantConfig.preset("bf16")), x.to(torch.bfloat16).float())


# --- exact round trips of on-grid values ---------------------------------------------

E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def on_grid_blocks(n_blocks: int, block: int, top: float, gen, exponents=range(-4, 5)) -> torch.Tensor:
    """Blocks of E2M1 values times 2**k, each block's largest magnitude exactly `top` * 2**k."""
    idx = torch.randint(0, 8, (n_blocks, block), generator=gen)
    vals = E2M1_MAGNITUDES[idx] * (top / 6.0)
    vals[:, 0] = top
    sign = torch.where(torch.rand(n_blocks, block, generator=gen) < 0.5, -1.0, 1.0)
    ks = torch.tensor(list(exponents), dtype=torch.float32)
    k = ks[torch.randint(0, len(ks), (n_blocks, 1), generator=gen)]
    return (vals * sign * torch.pow(2.0, k)).reshape(-1)


@pytest.mark.parametrize(
    "config",
    [
        QuantConfig.preset("mxfp4"),
        QuantConfig.preset("no_fwht", coarse_scale="none"),  # single-level E4M3
        QuantConfig.preset("nvfp4"),
    ],
    ids=["mxfp4", "e4m3-single-level", "nvfp4"],
)
def test_on_grid_values_round_trip_exactly(config, gen):
    x = on_grid_blocks(64, config.micro_group, 6.0, gen)
    if config.coarse_scale == "tensor":  # tensor scale exactly 1: amax 2688
        x[0] = 2688.0
        x[1 : config.micro_group] = 0.0
    assert torch.equal(round_trip(x, config), x)


def test_on_grid_values_round_trip_exactly_dual_scale(gen):
    # groups whose amax is 2688 * 2**k make the coarse scale exactly 2**k
    config = QuantConfig.preset("no_fwht")
    x = on_grid_blocks(64, 16, 6.0, gen, exponents=range(-3, 4)).view(-1, 256)
    x[:, 0] = 2688.0 * torch.pow(2.0, torch.arange(-3, 1).float())
    x[:, 1:16] = 0.0
    x = x.reshape(-1)
    assert torch.equal(round_trip(x, config), x)


def test_int4_and_fp8_on_grid(gen):
    q = torch.randint(-7, 8, (64, 32), generator=gen).float()
    q[:, 0] = 7.0
    x = (q * torch.pow(2.0, torch.randint(-5, 5, (64, 1), generator=gen).float())).reshape(-1)
    assert torch.equal(round_trip(x, QuantConfig.preset("int4")), x)
    e4m3 = torch.randint(0, 0x7F, (1024,), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e4m3 = e4m3.view(4, 256)
    e4m3[:, 0] = 448.0
    assert torch.equal(round_trip(e4m3.reshape(-1), QuantConfig.preset("fp8")), e4m3.reshape(-1))


# --- zeros, non-finite, extremes -----------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_all_zero_groups_decode_to_exact_zeros(name, gen):
    config = QuantConfig.preset(name)
    G = config.block if config.compressed else 16
    x = torch.randn(4, G, generator=gen)
    x[1] = 0.0
    x[3] = -0.0
    y = round_trip(x.reshape(-1), config).view(4, G)
    assert bool((y[1] == 0).all()) and bool((y[3] == 0).all())
    assert bool((round_trip(torch.zeros(1000), QuantConfig.preset(name)) == 0).all())


@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_signs_survive_a_round_trip_where_the_format_has_them(name, dtype, gen):
    """e2m1 / e4m3 keep the sign of a zero, and of a negative that rounds to zero, as a float
    cast does; int4 has no negative zero; the FWHT keeps no per-value sign of a zero."""
    config = QuantConfig.preset(name)
    G = config.block
    x = torch.randn(3, G, generator=gen)
    pick = torch.rand(G, generator=gen)
    x[0, pick < 0.25] = -0.0  # negative zeros among ordinary values
    tiny = (pick >= 0.25) & (pick < 0.5)
    x[0, tiny] = -x[0, tiny].abs() * 1e-7  # negatives that round to zero
    x[1] = -0.0  # an all-negative-zero block
    x[2, ::2], x[2, 1::2] = 0.0, -0.0
    x = x.reshape(-1).to(dtype)
    ref = codec.dequantize(codec.quantize(x, config))
    assert torch.equal(ref.view(torch.uint8), round_trip(x, config).view(torch.uint8))  # the kernels: same bits
    zero = ref == 0
    assert bool(zero[G:].all())  # all-zero blocks decode to zeros
    if config.fwht != "none":
        return  # a zero's sign is that of the inverse transform's sum (reference/codec.py)
    assert bool(zero[: G][pick < 0.5].all())
    if config.element == "int4":
        assert not torch.signbit(ref[zero]).any()
    else:
        assert torch.equal(torch.signbit(ref[zero]), torch.signbit(x[zero]))


@pytest.mark.parametrize("name", ["no_fwht", "mxfp4", "fp8"])
def test_a_sum_of_zeros_is_negative_only_where_every_term_is(name):
    """dequantize_reduce adds in IEEE float32: -0 + -0 = -0, -0 + +0 = +0 (either order)."""
    config = QuantConfig.preset(name)
    n = 2 * config.block
    neg, pos = torch.full((1, n), -0.0), torch.zeros(1, n)
    for rows, negative in (((neg, neg), True), ((neg, pos), False), ((pos, neg), False), ((pos, pos), False)):
        msgs = codec.quantize_rows(torch.cat(rows), config)
        assert torch.equal(msgs, ops.quantize_rows(torch.cat(rows), config))
        sums = codec.dequantize_reduce(msgs, n, config, torch.float32, requantize=False)
        requantized = codec.dequantize_reduce(msgs, n, config, torch.float32, requantize=True)
        decoded = codec.dequantize_rows(requantized[None], n, config, torch.float32, saturate=False)[0]
        assert torch.equal(requantized, ops.dequantize_reduce(msgs, n, config, torch.float32, True))
        for y in (sums, decoded, ops.dequantize_reduce(msgs, n, config, torch.float32, False)):
            assert bool((y == 0).all()) and torch.signbit(y).tolist() == [negative] * n, (name, negative)


def nan_expectation(name: str, numel: int, pos: int) -> slice:
    """The values that must decode to NaN when input[pos] is NaN."""
    config = QuantConfig.preset(name)
    if not config.compressed:
        return slice(pos, pos + 1)
    span = config.group if config.fwht != "none" else config.micro_group
    start = pos // span * span
    return slice(start, min(start + span, numel))


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_finite_decodes_to_nan_in_its_micro_group_only(name, bad, dtype, gen):
    numel = 5000  # three FWHT groups of 2048, the last partial
    x = torch.randn(numel, generator=gen).to(dtype)
    config = QuantConfig.preset(name)
    pos = 2100
    span = nan_expectation(name, numel, pos)
    clean = x.clone()
    clean[span] = 0.0  # what the other values decode to when the bad span holds nothing
    x_bad = x.clone()
    x_bad[span] = 0.0
    x_bad[pos] = bad
    y = round_trip(x_bad, config)
    if not config.compressed:
        assert torch.isnan(y[pos]) == (bad != bad) and (y[pos] == bad) == (bad == bad)
        return
    assert bool(torch.isnan(y[span]).all())
    others = torch.ones(numel, dtype=torch.bool)
    others[span] = False
    assert torch.equal(y[others], round_trip(clean, config)[others])


@pytest.mark.parametrize("name", COMPRESSED)
def test_nothing_non_finite_comes_back_finite(name, gen):
    x = torch.randn(4096, generator=gen)
    bad = torch.rand(4096, generator=gen) < 0.01
    kinds = torch.tensor([float("nan"), float("inf"), float("-inf")])
    x[bad] = kinds[torch.randint(0, 3, (int(bad.sum()),), generator=gen)]
    y = round_trip(x, QuantConfig.preset(name))
    assert not bool(torch.isfinite(y[bad]).any())
    assert not bool(torch.isinf(y).any())  # non-finite comes back as NaN, never as a fake infinity


@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4", "mxfp4", "fp8", "naive_pack"])
@pytest.mark.parametrize("magnitude", [1e38, 1e-30, 1e-40])
def test_extreme_magnitudes_keep_accuracy_where_the_format_has_range(name, magnitude, gen):
    x = torch.randn(4096, generator=gen) * (magnitude / 5)  # largest |x| ~ magnitude
    y = round_trip(x, QuantConfig.preset(name))
    assert bool(torch.isfinite(y).all())
    if name == "mxfp4" and magnitude < 1e-38:
        # E8M0 scales stop at 2**-127: subnormal blocks flush to zero (a limit of the format)
        assert bool((y == 0).all())
        return
    assert nmse(y, x) < gaussian_bound(name), nmse(y, x)


def test_range_limits_of_the_baselines_are_saturation_not_garbage(gen):
    x = torch.randn(4096, generator=gen) * 2e37
    y = round_trip(x, QuantConfig.preset("int4"))
    assert bool(torch.isfinite(y).all()) and float(y.abs().max()) <= 7 * 65504
    y = round_trip(x, QuantConfig.preset("no_fwht", coarse_scale="none"))
    assert float(y.abs().max()) <= 6 * 448
    # the transformed values saturate at 6 * 448; the inverse FWHT spreads them over the group
    y = round_trip(x, QuantConfig.preset("single_scale"))
    assert bool(torch.isfinite(y).all()) and float(y.abs().max()) <= 6 * 448 * 2048**0.5


def test_single_scale_underflows_on_small_magnitudes_where_fp4quant_does_not(gen):
    x = torch.randn(1 << 16, generator=gen) * 1e-6
    single = round_trip(x, QuantConfig.preset("single_scale"))
    dual = round_trip(x, QuantConfig.preset("fp4quant"))
    assert nmse(single, x) > 0.9 and float((single == 0).float().mean()) > 0.99
    assert nmse(dual, x) < 0.012


def test_float16_output_saturates_instead_of_overflowing():
    x = torch.full((256,), 65504.0, dtype=torch.float16)
    x[::2] = -65504.0
    for name in COMPRESSED:
        y = round_trip(x, QuantConfig.preset(name))
        assert bool(torch.isfinite(y).all()), name


# --- stochastic rounding --------------------------------------------------------------


def test_stochastic_rounding_reproducible_from_generator(gen):
    x = torch.randn(2048, generator=gen)
    config = QuantConfig(rounding="stochastic")
    a = quantize(x, config, generator=torch.Generator().manual_seed(5))
    b = quantize(x, config, generator=torch.Generator().manual_seed(5))
    c = quantize(x, config, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.codes, b.codes)
    assert not torch.equal(a.codes, c.codes)
    # scales do not depend on the random stream
    assert torch.equal(a.micro_scales, c.micro_scales)


def test_stochastic_rounding_depends_on_seed_and_offset(gen):
    x = torch.randn(1024, generator=gen)
    config = QuantConfig(rounding="stochastic")
    base = reference_quantize(x, config, seed=1, offset=0).codes
    assert not torch.equal(base, reference_quantize(x, config, seed=2, offset=0).codes)
    assert not torch.equal(base, reference_quantize(x, config, seed=1, offset=1 << 33).codes)
    assert torch.equal(base, reference_quantize(x, config, seed=1, offset=0).codes)


@pytest.mark.parametrize("name", COMPRESSED)
def test_stochastic_rounding_is_unbiased(name):
    """The mean of D draws converges to x: QuantConfig(rounding="stochastic") alone, no other field.

    Each value's draws have some variance s_j^2 (estimated from the draws); if rounding is
    unbiased the mean's squared error has expectation s_j^2 / D, so the ratio R of the summed
    squared errors to the summed s_j^2 / D is about 1 (within a few percent over 4096 values;
    per value, s_j estimated from a handful of rare roundings is too rough to test).  A biased rule (a micro-scale rounded down,
    saturating its largest values at the element maximum) puts R in the hundreds.  The draws'
    seeds are fixed, so the outcome is too.
    """
    config = QuantConfig.preset(name, rounding="stochastic")
    g = torch.Generator().manual_seed(7)
    n, draws = 4096, 400
    signs = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = 0.3 * torch.linspace(0.5, 1.5, n) * signs  # the example: values near each group's maximum
    x[n // 2 :] = torch.randn(n // 2, generator=g) * 0.3
    ys = torch.stack([dequantize(quantize(x, config, generator=torch.Generator().manual_seed(d))) for d in range(draws)])
    ys, x = ys.double(), x.double()
    err = ys.mean(dim=0) - x
    var = ys.var(dim=0)  # unbiased estimate of each value's variance
    assert float(var.mean()) > 0, "stochastic rounding made no noise"
    ratio = float((err**2).sum() / (var.sum() / draws))
    assert 0.7 < ratio < 1.5, f"{name}: squared bias is {ratio:.1f}x what unbiased rounding allows"
    nearest = dequantize(quantize(x.float(), config.replace(rounding="nearest"))).double()
    assert float(((nearest - x) ** 2).sum()) > 50 * float((err**2).sum())
