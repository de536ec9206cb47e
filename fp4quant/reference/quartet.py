"""Quartet's FP4 linear layer (Castro et al., arXiv 2505.14669), pseudo-quantized.

Every operand of the three GEMMs of a linear layer is put on MXFP4's grid (E2M1 values in
groups of 32 with power-of-two scales) after a 32-wide Hadamard transform of the dimension
the GEMM contracts, then multiplied in float32.  Since both operands of a product are
rotated alike, H H^T = I leaves the product as it was except for the quantization.

forward   y = Q(x H) Q(W H)^T with QuEST's quantizer: the group's scale from its RMS
          (QUEST_SCALE x std, the MSE-optimal clipping of a Gaussian on E2M1 over the grid's
          maximum), rounded down to a power of two; round to nearest; values beyond the grid
          are clipped and a mask of the unclipped ones gates the straight-through gradient.
backward  dL/dx = Q(G Hs) Q(Wq^T Hs)^T and dL/dW = Q(G^T Hs) Q(xq^T Hs)^T, each masked and
          rotated back by H^T.  Hs is the Hadamard with fresh random signs on every backward
          pass; Q here scales each group so that its maximum lands in [3, 6) (the power of
          two at or below the maximum, over 4, then a 3/4 pre-scale) and rounds
          stochastically, so E[Q(v)] = v: the gradient estimate is unbiased.

What Quartet runs on Blackwell as native MXFP4 GEMMs (QuTLASS) this computes as
quantize -> dequantize -> float32 GEMM, the way Quartet was validated at small scale: the
numbers are FP4's, the speed is not.  Random bits come from counter-based streams
(fp4quant.format.random) keyed by an explicit seed, so a run is reproducible and resumable.
"""

from __future__ import annotations

import torch

from ..format.elements import E2M1, exponent_bits, pow2
from ..format.random import fwht_signs, uniform
from .fwht import fwht, ifwht

GROUP = 32  # MXFP4's group and Quartet's Hadamard size
QUEST_SCALE = 2.92247856 / 6.0  # QuEST: MSE-optimal Gaussian clip (2.92 sigma) over E2M1's maximum
SR_PRESCALE = 0.75  # Quartet's backward: the group maximum over its power of two, x 3/4, stays below 6


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A 2-D tensor's rows padded with zeros to a multiple of GROUP columns, in float32."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D operand, got shape {tuple(x.shape)}")
    cols = x.shape[1]
    pad = -cols % GROUP
    x = x.to(torch.float32)
    return (torch.nn.functional.pad(x, (0, pad)) if pad else x), cols


def rotate(x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
    """x's rows (a multiple of GROUP wide) through the orthonormal GROUP-wide Hadamard transform."""
    return fwht(x, GROUP, signs)


def unrotate(x: torch.Tensor, signs: torch.Tensor | None = None) -> torch.Tensor:
    return ifwht(x, GROUP, signs)


def quest(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """QuEST's forward quantizer on rows of groups of GROUP values: (dequantized, clip mask).

    scale = QUEST_SCALE * std(group) + 1e-8, rounded down to a power of two; values are
    divided by it, rounded to the nearest E2M1 value (ties to even; QuEST's kernel breaks
    ties downward, which differs on a set of measure zero) and saturate at 6; the mask marks
    |value / scale| < 6, the ones whose gradient passes.  NaN or Inf in a group makes the
    whole group NaN."""
    g = x.reshape(-1, GROUP).to(torch.float32)
    mean = g.mean(dim=1, keepdim=True)
    var = (g * g).mean(dim=1, keepdim=True) - mean * mean
    std = torch.where(var >= 0, torch.sqrt(var.clamp(min=0)), torch.ones_like(var))  # QuEST's guard
    scale = pow2(exponent_bits(QUEST_SCALE * std + 1e-8).clamp(-126, 127))
    finite = torch.isfinite(g).all(dim=1, keepdim=True)  # Inf - Inf would pass the guard as std 1
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    v = g / scale
    q = torch.copysign(E2M1.round(v.abs(), "nearest"), v)
    return (q * scale).reshape(x.shape), (v.abs() < E2M1.max).reshape(x.shape)


def stochastic(x: torch.Tensor, seed: int, offset: int = 0) -> torch.Tensor:
    """Quartet's backward quantizer (dequantized) on rows of groups of GROUP values: each
    group's maximum is scaled into [3, 6) and every value rounded stochastically onto E2M1,
    with the uniforms of stream ``seed`` from counter ``offset``.  Unbiased: E[result] = x."""
    g = x.reshape(-1, GROUP).to(torch.float32)
    amax = g.abs().amax(dim=1, keepdim=True)
    # 2**(floor(log2 amax) - 2) / (3/4): amax / scale in [3, 6); all-zero groups stay zero
    e = exponent_bits(amax).clamp(-124, 127) - 2
    scale = torch.where(amax > 0, pow2(e) / SR_PRESCALE, torch.ones_like(amax))
    scale = torch.where(torch.isfinite(amax), scale, torch.full_like(amax, float("nan")))
    v = g / scale
    u = uniform(v.numel(), seed, offset, v.device).reshape(v.shape)
    q = torch.copysign(E2M1.round(v.abs(), "stochastic", u), v)
    return (q * scale).reshape(x.shape)


def backward_signs(seed: int, device) -> torch.Tensor:
    """The random signs of one backward pass's Hadamard (a fresh draw per seed)."""
    return fwht_signs(GROUP, seed, device)


WEIGHT_GRAD_OFFSET = 2**40  # the weight gradient's counters start here, the input gradient's at 0


def _sr_product(a: torch.Tensor, b: torch.Tensor, signs: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """a @ b.T with the contracted dimension rotated by the signed Hadamard and both operands
    stochastically quantized, from counter ``offset`` of stream ``seed`` on."""
    a, _ = _rows(a)
    b, _ = _rows(b)
    qa = stochastic(rotate(a, signs), seed, offset)
    qb = stochastic(rotate(b, signs), seed, offset + qa.numel())
    return qa @ qb.T


class QuartetLinear(torch.autograd.Function):
    """y = x W^T + b with Quartet's forward and backward quantization (see the module doc).
    ``seed`` keys this call's backward randomness: the caller gives every call its own."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seed: int):
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"input features {x.shape[-1]} != weight's {weight.shape[1]}")
        x2, cols = _rows(x.reshape(-1, x.shape[-1]))
        w2, _ = _rows(weight)
        xq, x_mask = quest(rotate(x2))
        wq, w_mask = quest(rotate(w2))
        # the output is its own tensor, not a view (callers reduce it in place)
        y = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32, device=x.device)
        torch.mm(xq, wq.T, out=y.view(-1, weight.shape[0]))
        if bias is not None:
            y += bias.to(torch.float32)
        ctx.save_for_backward(xq, wq, x_mask, w_mask)
        ctx.meta = (x.shape, x.dtype, weight.dtype, cols, seed, bias is not None)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xq, wq, x_mask, w_mask = ctx.saved_tensors
        x_shape, x_dtype, w_dtype, cols, seed, has_bias = ctx.meta
        g = grad.reshape(-1, grad.shape[-1]).to(torch.float32)
        signs = backward_signs(seed, g.device)  # one draw per backward pass, as Quartet's
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # contracts the output features
            gx = _sr_product(g, wq.T, signs, seed, 0)
            grad_x = unrotate(gx * x_mask)[:, :cols].reshape(x_shape).to(x_dtype)
        if ctx.needs_input_grad[1]:  # contracts the tokens
            gw = _sr_product(g.T, xq.T, signs, seed, WEIGHT_GRAD_OFFSET)
            grad_w = unrotate(gw * w_mask)[:, :cols].to(w_dtype)
        if has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(dim=0).to(w_dtype)
        return grad_x, grad_w, grad_b, None


def quartet_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seed: int) -> torch.Tensor:
    return QuartetLinear.apply(x, weight, bias, seed)
