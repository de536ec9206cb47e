"""Quartet's pseudo-quantized FP4 linear layer against QuEST's formula, and its gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp4quant.reference import quartet
from fp4quant.reference.quartet import GROUP, quartet_linear, quest, rotate, stochastic, unrotate


def quest_transcribed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QuEST's MXFP4 forward quantizer, transcribed step by step from its published formula
    (RMS scale 2.92247856 / 6 * std + 1e-8, rounded down to a power of two; the thresholds of
    round-to-nearest onto E2M1; the clip mask |x / scale| < 6), in float64 numpy."""
    g = x.reshape(-1, 32).astype(np.float64)
    mean = g.mean(axis=1, keepdims=True)
    std = np.sqrt(np.maximum((g * g).mean(axis=1, keepdims=True) - mean * mean, 0))
    scale = 2.0 ** np.floor(np.log2(2.92247856 / 6.0 * std + 1e-8))
    v = g / scale
    a = np.abs(v)
    q = np.select([a > 5, a > 3.5, a > 2.5, a > 1.75, a > 1.25, a > 0.75, a > 0.25], [6, 4, 3, 2, 1.5, 1, 0.5], 0.0)
    return (np.sign(v) * q * scale).reshape(x.shape), (a < 6).reshape(x.shape)


@pytest.mark.parametrize("spread", [1e-3, 1.0, 1e4])
def test_quest_equals_its_formula(spread):
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1)) * spread
    x[3] *= 50  # a row with a wide range
    x[7, :32] = 0  # an all-zero group
    got, mask = quest(x)
    want, want_mask = quest_transcribed(x.numpy())
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(mask.numpy(), want_mask)
    # a Gaussian clips at 1.46 to 2.92 sigma (the scale is rounded down to a power of two): ~7%
    assert 0.85 < mask.float().mean() < 0.99


def test_quest_keeps_nan_and_inf_in_their_group():
    x = torch.randn(4, 64)
    x[0, 3], x[2, 40] = float("nan"), float("inf")
    got, _ = quest(x)
    assert got[0, :32].isnan().all() and got[2, 32:].isnan().all()
    assert torch.isfinite(got[0, 32:]).all() and torch.isfinite(got[1]).all() and torch.isfinite(got[3]).all()


def test_stochastic_rounding_is_unbiased_and_never_clips():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 3, 8)[:, None]
    draws = torch.stack([stochastic(x, seed) for seed in range(2000)])
    grid = x.abs().reshape(-1, GROUP).amax(1).repeat_interleave(GROUP).reshape(x.shape)  # per-group maximum
    # every draw is one of the two grid neighbours, so the spread of the mean is known; 5 sigma
    err = (draws.mean(0) - x).abs()
    assert (err <= 5 * grid / 4 / np.sqrt(2000) + 1e-12).all()
    assert (draws.abs().amax(0) <= 2 * grid).all()  # nothing saturates: the maximum lands below 6
    assert torch.equal(stochastic(x, 5), stochastic(x, 5)) and not torch.equal(stochastic(x, 5), stochastic(x, 6))


def test_rotation_round_trips():
    x = torch.randn(16, 96, dtype=torch.float64)
    signs = quartet.backward_signs(3, "cpu").to(torch.float64)
    torch.testing.assert_close(unrotate(rotate(x, signs), signs), x, rtol=0, atol=1e-12)


def exact_ste_gradients(x, w, g):
    """The gradients Quartet's backward estimates: the forward's quantized operands with the
    clip masks as straight-through gates, in exact arithmetic (no backward quantization)."""
    xr, wr = rotate(x), rotate(w)
    xq, xm = quest(xr)
    wq, wm = quest(wr)
    return unrotate((g @ wq) * xm), unrotate((g.T @ xq) * wm)


def test_backward_is_an_unbiased_estimate_of_the_masked_gradient():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(64, 64, generator=gen), torch.randn(32, 64, generator=gen)
    g = torch.randn(64, 32, generator=gen)
    want_x, want_w = exact_ste_gradients(x, w, g)
    draws = 600
    sum_x, sum_w = torch.zeros_like(x), torch.zeros_like(w)
    for seed in range(draws):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        quartet_linear(xs, ws, None, seed).backward(g)
        sum_x += xs.grad
        sum_w += ws.grad
    # the mean's error shrinks like 1/sqrt(draws): far below one draw's error, near zero
    one_x = xs.grad - want_x
    mean_x, mean_w = sum_x / draws - want_x, sum_w / draws - want_w
    assert mean_x.norm() < 3 * one_x.norm() / np.sqrt(draws)
    assert mean_w.norm() < 3 * (ws.grad - want_w).norm() / np.sqrt(draws)


def test_clipped_values_pass_no_gradient():
    xr = torch.randn(32, 32, generator=torch.Generator().manual_seed(4))
    xr[5, 7] = 50.0  # an outlier in the rotated domain clips
    x = unrotate(xr)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(16, 32, generator=gen)
    _, mask = quest(rotate(x))
    assert not mask[5, 7] and not mask.all()
    xs = x.clone().requires_grad_()
    quartet_linear(xs, w, None, 0).backward(torch.randn(32, 16, generator=gen))
    rotated_grad = rotate(xs.grad)
    # zero up to the float32 rounding of rotating back and forth (relative to the gradient's size)
    assert (rotated_grad[~mask].abs() <= 1e-6 * rotated_grad.abs().max()).all()
    assert (rotated_grad[mask] != 0).float().mean() > 0.9


@pytest.mark.parametrize("shape, features, out", [((3, 5, 40), 40, 24), ((7, 96), 96, 8), ((2, 1, 33), 33, 70)])
def test_any_shape_pads_to_whole_groups(shape, features, out):
    torch.manual_seed(features)
    x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(out, features, requires_grad=True)
    b = torch.randn(out, requires_grad=True)
    y = quartet_linear(x, w, b, 11)
    assert y.shape == (*shape[:-1], out) and y.dtype == torch.bfloat16
    rel = (y.float() - torch.nn.functional.linear(x.float(), w, b)).norm() / y.float().norm()
    assert rel < 0.5
    g = torch.randn_like(y)
    y.backward(g)
    assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16 and w.grad.shape == w.shape
    torch.testing.assert_close(b.grad, g.float().reshape(-1, out).sum(0))
    # the same seed gives the same gradients: resumable
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    quartet_linear(x2, w2, b.detach(), 11).backward(g)
    assert torch.equal(x2.grad, x.grad) and torch.equal(w2.grad, w.grad)


def test_mismatched_features_are_refused():
    with pytest.raises(ValueError, match="input features 5 != weight's 6"):
        quartet_linear(torch.randn(2, 5), torch.randn(3, 6), None, 0)
