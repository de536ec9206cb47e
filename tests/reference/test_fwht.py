"""The two-level FWHT: against scipy's Hadamard matrix, orthonormal, two-level == single-level."""

from __future__ import annotations

import pytest
import scipy.linalg
import torch

from fp4quant import fwht, ifwht
from fp4quant.format.random import fwht_signs
from fp4quant.reference.fwht import butterflies, inv_sqrt, two_level_transform

SIZES = [1, 2, 16, 32, 64, 128, 256, 1024, 2048]


@pytest.mark.parametrize("n", SIZES)
def test_matches_scipy_hadamard(n, gen):
    x = torch.randn(7, n, generator=gen, dtype=torch.float64)
    H = torch.tensor(scipy.linalg.hadamard(n), dtype=torch.float64)
    want = x @ H / n**0.5
    got = fwht(x.float(), n).double()
    assert torch.allclose(got, want, atol=1e-5 * x.abs().max().item() * n**0.5 / 4, rtol=0)


@pytest.mark.parametrize("n", SIZES)
def test_float64_input_is_transformed_in_float64(n, gen):
    x = torch.randn(7, n, generator=gen, dtype=torch.float64)
    H = torch.tensor(scipy.linalg.hadamard(n), dtype=torch.float64)
    s = fwht_signs(n, 5).double()
    want = (x * s) @ H / n**0.5
    got = fwht(x, n, signs=5)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, atol=1e-12, rtol=0), float((got - want).abs().max())
    back = ifwht(got, n, signs=5)
    assert back.dtype == torch.float64 and torch.allclose(back, x, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [16, 256, 1024])
def test_signs_are_a_diagonal_before_the_transform(n, gen):
    x = torch.randn(5, n, generator=gen)
    s = fwht_signs(n, 7)
    assert set(s.unique().tolist()) <= {-1.0, 1.0} and (s == -1).any() and (s == 1).any()
    assert torch.equal(fwht(x, n, signs=7), fwht(x * s, n))
    assert torch.equal(fwht(x, n, signs=s), fwht(x, n, signs=7))


@pytest.mark.parametrize("n", [16, 256, 2048])
def test_orthonormal_preserves_norm_and_inverts(n, gen):
    x = torch.randn(11, n, generator=gen, dtype=torch.float64)
    y = fwht(x, n, signs=3)
    assert torch.allclose(y.norm(dim=1), x.norm(dim=1), rtol=1e-6)
    assert torch.allclose(ifwht(y, n, signs=3), x, atol=1e-6)
    assert torch.allclose(fwht(ifwht(x, n), n), x, atol=1e-6)


def recursive_wht(x: torch.Tensor) -> torch.Tensor:
    """Textbook recursive Sylvester WHT (unnormalized), a separate oracle."""
    n = x.shape[-1]
    if n == 1:
        return x
    a, b = recursive_wht(x[..., : n // 2]), recursive_wht(x[..., n // 2 :])
    return torch.cat([a + b, a - b], dim=-1)


@pytest.mark.parametrize("n, micro", [(256, 16), (1024, 16), (512, 32), (16, 16), (8, 16)])
def test_two_level_is_bit_identical_to_single_level(n, micro, gen):
    x = torch.randn(9, n, generator=gen) * torch.logspace(-3, 3, 9)[:, None]
    single = butterflies(x, n)  # all strides, one loop
    assert torch.equal(two_level_transform(x, n, micro), single)
    oracle = recursive_wht(x.double())
    scale = x.abs().amax(dim=1, keepdim=True).double() * n
    assert bool(((single.double() - oracle).abs() <= 1e-6 * scale).all())


def test_level_one_stays_inside_micro_groups(gen):
    x = torch.zeros(1, 256)
    x[0, 20] = 1.0  # micro-group 1
    level_one = butterflies(x, 256, 1, 8)
    assert bool((level_one[0, :16] == 0).all()) and bool((level_one[0, 32:] == 0).all())
    assert bool((level_one[0, 16:32].abs() == 1).all())


def test_inv_sqrt_exact_for_even_powers():
    assert inv_sqrt(256) == 1 / 16 and inv_sqrt(16) == 0.25


def test_dtype_and_shape_kept(gen):
    x = torch.randn(4, 8, 32, generator=gen).to(torch.bfloat16)
    y = fwht(x, 16)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape


def test_errors():
    with pytest.raises(ValueError, match="power of two"):
        fwht(torch.randn(12), 12)
    with pytest.raises(ValueError, match="divisible by 16"):
        fwht(torch.randn(20), 16)
    with pytest.raises(TypeError, match="floating-point"):
        fwht(torch.arange(16), 16)
    with pytest.raises(ValueError, match="signs must have shape"):
        fwht(torch.randn(16), 16, signs=torch.ones(8))
