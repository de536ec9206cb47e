"""Property tests (hypothesis): wire round trips, error bounds, non-finite propagation."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp4quant import Packed, QuantConfig, dequantize, quantize
from fp4quant.format.config import PRESETS

PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite32 = st.floats(min_value=-(2.0**124), max_value=2.0**124, allow_nan=False, width=32)
tensors = st.lists(finite32, min_size=1, max_size=600).map(lambda v: torch.tensor(v, dtype=torch.float32))
presets = st.sampled_from(sorted(PRESETS))
dtypes = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


@PROFILE
@given(x=tensors, name=presets, dtype=dtypes)
def test_wire_round_trip_is_lossless(x, name, dtype):
    config = QuantConfig.preset(name)
    x = x.to(dtype)
    p = quantize(x, config)
    q = Packed.from_bytes(p.to_bytes(), x.shape, dtype, config)
    assert torch.equal(dequantize(q).view(torch.uint8), dequantize(p).view(torch.uint8))


@PROFILE
@given(x=tensors, name=st.sampled_from(["no_fwht", "nvfp4", "mxfp4"]))
def test_error_within_half_a_step_of_the_micro_group(x, name):
    """Without the FWHT each value is off by at most one grid step of its micro-group's scale."""
    config = QuantConfig.preset(name)
    p = quantize(x, config)
    y = dequantize(p)
    M = config.micro_group
    n = x.numel()
    pad = -n % M
    xm = torch.nn.functional.pad(x, (0, pad)).view(-1, M).double()
    ym = torch.nn.functional.pad(y, (0, pad)).view(-1, M).double()
    amax = xm.abs().amax(dim=1, keepdim=True)
    # The largest E2M1 step is 2 (between 4 and 6) at scale ~amax/6; the scale's own
    # rounding (e4m3: <= 1/16 relative; e8m0 floor: values up to 8/6 of the range saturate)
    # adds at most 1/3 of amax.  Tiny groups are limited by the scale's lower clamp.
    bound = amax / 3 + amax / 6 * 1.07 + 1e-30
    if config.micro_scale == "e4m3" and config.coarse_scale == "none":
        bound = bound + 2.0**-6
    if config.coarse_scale == "tensor":
        bound = bound + x.abs().max().double() / 2688 * 2.0**-6
    if config.coarse_scale == "group":  # micro-scales >= 2**-6 times the group's scale
        G = config.group
        group_amax = torch.nn.functional.pad(x, (0, -n % G)).view(-1, G).abs().amax(dim=1).double()
        bound = bound + (group_amax / 2688 * 2.0**-6).repeat_interleave(G // M)[: xm.shape[0], None]
    assert bool(((ym - xm).abs() <= bound).all())


@PROFILE
@given(x=tensors, name=st.sampled_from(["fp4quant", "single_scale"]))
def test_fwht_error_bounded_in_l2_per_group(x, name):
    """With the FWHT the error is bounded in the transformed domain, and the transform is orthonormal."""
    config = QuantConfig.preset(name)
    x = x / 1e6  # keep the unnormalized single_scale transform in range
    y = dequantize(quantize(x, config))
    G = config.group
    n = x.numel()
    xg = torch.nn.functional.pad(x, (0, -n % G)).view(-1, G).double()
    yg = torch.nn.functional.pad(y, (0, -n % G)).view(-1, G).double()
    err = (yg - xg).norm(dim=1)
    # every transformed value is at most sqrt(G) * amax(x); its error at most that / 2
    bound = math.sqrt(G) * xg.abs().amax(dim=1) * math.sqrt(G) / 2 + 2.0**-6 * math.sqrt(G)
    assert bool((err <= bound).all())


@PROFILE
@given(
    x=tensors,
    name=st.sampled_from(sorted(p for p in PRESETS if p != "bf16")),
    where=st.lists(st.integers(min_value=0, max_value=599), min_size=1, max_size=5),
    kind=st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_non_finite_never_comes_back_finite(x, name, where, kind):
    where = [w % x.numel() for w in where]
    x = x.clone()
    x[where] = kind
    y = dequantize(quantize(x, QuantConfig.preset(name)))
    assert bool(torch.isnan(y[where]).all())
    assert not bool(torch.isinf(y).any())


@PROFILE
@given(x=tensors, name=presets)
def test_quantize_is_deterministic_and_shape_preserving(x, name):
    config = QuantConfig.preset(name)
    a, b = quantize(x, config), quantize(x.clone(), config)
    assert torch.equal(a.to_bytes(), b.to_bytes())
    assert dequantize(a).shape == x.shape
