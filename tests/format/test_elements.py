"""Element and scale formats: rounding at and around every tie point, codes, nibble order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp4quant.format.elements import (
    E2M1,
    E2M1_VALUES,
    E4M3,
    FP16,
    INT4,
    decode_element,
    decode_scale,
    encode_e8m0,
    encode_element,
    encode_scale,
    pack_nibbles,
    pow2,
    unpack_nibbles,
)

E2M1_GRID = np.array(E2M1_VALUES)


def oracle_rne(a: float, grid: np.ndarray, max_mantissa_even) -> float:
    """Nearest grid value in float64, ties to the value whose code is even."""
    d = np.abs(grid - a)
    best = np.flatnonzero(d == d.min())
    if len(best) == 1:
        return float(grid[best[0]])
    return float(grid[[i for i in best if max_mantissa_even(i)][0]])


def neighbours(v: float) -> list[float]:
    """v and the float32 values just below and above it."""
    f = np.float32(v)
    return [float(np.nextafter(f, np.float32(-np.inf))), float(f), float(np.nextafter(f, np.float32(np.inf)))]


def e2m1_probe_points() -> list[float]:
    points = set()
    for v in E2M1_VALUES:
        points.update(neighbours(v))
    for lo, hi in zip(E2M1_VALUES, E2M1_VALUES[1:]):
        points.update(neighbours((lo + hi) / 2))
    points.update([6.5, 7.0, 100.0, 1e30, 2.0**-30, 1e-45, 0.0])
    return sorted(p for p in points if p >= 0)


@pytest.mark.parametrize("a", e2m1_probe_points())
def test_e2m1_round_nearest_even_around_every_tie(a):
    got = float(E2M1.round(torch.tensor([a], dtype=torch.float32), "nearest")[0])
    # code index parity = mantissa parity in E2M1
    want = oracle_rne(min(a, 6.0), E2M1_GRID, lambda i: i % 2 == 0)
    assert got == want, (a, got, want)


def test_e2m1_ties_as_the_spec_lists():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert E2M1.round(ties, "nearest").tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_e2m1_codes_match_ocp_table():
    # code = sign<<3 | exp<<1 | mant ; value = 2^(exp-1) * (1 + mant/2), subnormal 0.5*mant
    for code in range(16):
        sign, exp, mant = code >> 3, (code >> 1) & 3, code & 1
        value = (0.5 * mant if exp == 0 else 2.0 ** (exp - 1) * (1 + mant / 2)) * (-1) ** sign
        assert float(decode_element(torch.tensor([code]), "e2m1")[0]) == value
        q = torch.tensor([abs(value)])
        assert int(encode_element(q, torch.tensor([sign == 1]), "e2m1")[0]) == code


def test_e2m1_negative_zero_keeps_sign():
    q = torch.zeros(2)
    codes = encode_element(q, torch.tensor([False, True]), "e2m1")
    assert codes.tolist() == [0, 8]


def test_negative_zero_codes_decode_to_negative_zero_as_the_fp8_cast_does():
    # torch's float8_e4m3fn cast keeps the sign of -0.0 and of negatives that round to zero
    neg = torch.tensor([-0.0, -1e-30, -(2.0**-11)])
    assert neg.to(torch.float8_e4m3fn).view(torch.uint8).tolist() == [0x80] * 3
    for element, code in (("e2m1", 8), ("e4m3", 0x80)):
        grid = {"e2m1": E2M1, "e4m3": E4M3}[element]
        q = grid.round(neg.abs(), "nearest")
        assert torch.equal(encode_element(q, torch.signbit(neg), element), torch.full((3,), code, dtype=torch.int32))
        zeros = decode_element(torch.tensor([0, code]), element)
        assert zeros.tolist() == [0.0, 0.0] and torch.signbit(zeros).tolist() == [False, True], element
    # int4 (two's complement) has no negative zero: a negative zero is +0
    codes = encode_element(torch.zeros(2), torch.tensor([False, True]), "int4")
    assert codes.tolist() == [0, 0] and not torch.signbit(decode_element(codes, "int4")).any()


def test_nibble_order_low_first():
    codes = torch.tensor([1, 2, 3, 4, 15, 0], dtype=torch.int32)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0x43, 0x0F]
    assert unpack_nibbles(packed).tolist() == codes.tolist()


def test_e4m3_grid_matches_torch_cast_rne():
    g = torch.Generator().manual_seed(0)
    a = torch.cat([
        torch.rand(20000, generator=g) * 500,
        torch.rand(20000, generator=g) * 2.0**-5,
        torch.tensor([448.0, 464.0, 480.0, 1e9, 2.0**-9, 2.0**-10, 3 * 2.0**-11]),
    ])
    want = a.to(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(E4M3.round(a, "nearest"), want)


def test_fp16_grid_matches_torch_cast_rne():
    g = torch.Generator().manual_seed(1)
    a = torch.cat([torch.rand(20000, generator=g) * 60000, torch.rand(20000, generator=g) * 1e-4])
    assert torch.equal(FP16.round(a, "nearest"), a.to(torch.float16).to(torch.float32))


@pytest.mark.parametrize("grid", [E2M1, E4M3, FP16, INT4], ids=lambda g: g.name)
def test_round_up_is_smallest_grid_value_at_or_above(grid):
    g = torch.Generator().manual_seed(2)
    a = torch.rand(5000, generator=g) * grid.max
    up = grid.round(a, "up")
    near = grid.round(a, "nearest")
    assert bool((up >= a).all())
    # on-grid values stay, and "up" is at most one grid step above "nearest"
    assert torch.equal(grid.round(up, "up"), up)
    assert torch.equal(grid.round(up, "nearest"), up)
    assert bool(((up == near) | (up > a)).all())


def test_int4_rounding_and_codes():
    a = torch.tensor([0.5, 1.5, 2.5, 6.49, 6.5, 7.4, 100.0])
    assert INT4.round(a, "nearest").tolist() == [0.0, 2.0, 2.0, 6.0, 6.0, 7.0, 7.0]
    q = torch.arange(8, dtype=torch.float32)
    for neg in (False, True):
        codes = encode_element(q, torch.full((8,), neg), "int4")
        assert decode_element(codes, "int4").tolist() == [(-v if neg else v) + 0.0 for v in q.tolist()]


def all_values(grid) -> torch.Tensor:
    if grid is E2M1:
        return torch.tensor(E2M1_VALUES)
    if grid is INT4:
        return torch.arange(8, dtype=torch.float32)
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


@pytest.mark.parametrize("grid", [E2M1, E4M3, INT4], ids=lambda g: g.name)
def test_stochastic_rounding_picks_floor_or_ceil_by_u(grid):
    values = all_values(grid)
    g = torch.Generator().manual_seed(3)
    a = torch.cat([torch.rand(3000, generator=g) * grid.max * 1.2, values])
    clamped = torch.clamp(a, max=grid.max)
    floor = values[torch.searchsorted(values, clamped, right=True) - 1]
    ceil = values[torch.searchsorted(values, clamped, right=False).clamp(max=len(values) - 1)]
    # u = 0 rounds up exactly when off the grid; u just below 1 never rounds up
    assert torch.equal(grid.round(a, "stochastic", torch.zeros_like(a)), ceil)
    assert torch.equal(grid.round(a, "stochastic", torch.full_like(a, 1 - 2.0**-24)), floor)
    # in between, up iff u < (a - floor) / (ceil - floor)
    u = torch.rand(a.shape, generator=g)
    frac = torch.where(ceil > floor, (clamped - floor) / (ceil - floor), 0.0)
    want = torch.where(u < frac, ceil, floor)
    assert torch.equal(grid.round(a, "stochastic", u), want)


def test_e4m3_scale_clamps_and_nan():
    t = torch.tensor([0.0, 1e-9, 2.0**-6, 1.0, 447.0, 1e6, float("nan")])
    stored = encode_scale(t, "e4m3", "nearest")
    assert decode_scale(stored, "e4m3")[:6].tolist() == [2.0**-6, 2.0**-6, 2.0**-6, 1.0, 448.0, 448.0]
    assert int(stored[6]) == 0x7F and math.isnan(float(decode_scale(stored, "e4m3")[6]))


def test_fp16_scale_clamps():
    t = torch.tensor([0.0, 1e-9, 1.0, 1e6])
    assert decode_scale(encode_scale(t, "fp16", "nearest"), "fp16").tolist() == [2.0**-14, 2.0**-14, 1.0, 65504.0]


def test_e8m0_floor_rule_and_up_rule():
    amax = torch.tensor([1.0, 6.0, 7.9, 8.0, 0.0, 3e38, float("nan")])
    floor = encode_e8m0(amax, 6.0, "floor")
    # floor: 2^(floor(log2 amax) - 2)
    assert floor[:4].tolist() == [127 - 2, 127 + 0, 127 + 0, 127 + 1]
    assert int(floor[4]) == 0 and int(floor[6]) == 0xFF
    up = encode_e8m0(amax[:4], 6.0, "up")
    scales = decode_scale(up, "e8m0")
    assert bool((amax[:4] / scales <= 6.0).all())
    assert bool((amax[:4] / (scales / 2) > 6.0).all())  # smallest such power of two


def test_e8m0_decode_extremes():
    stored = torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8)
    v = decode_scale(stored, "e8m0")
    assert v[:4].tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]
    assert math.isnan(float(v[4]))


def test_pow2_exact_over_normal_range():
    e = torch.arange(-126, 128)
    assert torch.equal(pow2(e).double(), torch.pow(2.0, e.double()))
