"""Orthonormal fast Walsh-Hadamard transform, computed in two levels.

For a block of n = m * k values (m = micro-group, 16 by default) the Sylvester
Hadamard matrix factors as H_n = H_k (x) H_m, so the transform is

  level one:  a size-m transform inside every micro-group (on a GPU: registers
              and warp shuffles), the butterflies of stride 1, 2, .., m/2;
  level two:  a size-k transform across the micro-groups (on a GPU: shared
              memory), the butterflies of stride m, 2m, .., n/2;

then one multiplication by fp32(1/sqrt(n)).  Each butterfly output is one IEEE
add or subtract of two defined values, so a kernel that runs the same stages in
the same order (whatever its parallel schedule) gets the same bits.  Running the
stages of both levels back to back *is* the single-level radix-2 transform,
which is why the two are bit-identical.
"""

from __future__ import annotations

import math

import torch

from ..format.random import fwht_signs


def _check_size(n: int) -> None:
    if not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"FWHT size must be a power of two, got {n!r}")


def butterflies(x: torch.Tensor, n: int, first_stride: int = 1, last_stride: int | None = None) -> torch.Tensor:
    """Unnormalized radix-2 butterflies of strides first_stride .. last_stride on rows of n.

    ``x`` is float32 (or float64) of shape (rows, n).  Stride h pairs element i with i + h
    (i with bit h clear) into (a + b, a - b).
    """
    last_stride = n // 2 if last_stride is None else last_stride
    rows = x.shape[0]
    h = first_stride
    while h <= last_stride:
        pairs = x.view(rows, n // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        x = torch.stack((a + b, a - b), dim=2).view(rows, n)
        h *= 2
    return x


def two_level_transform(x: torch.Tensor, n: int, micro: int) -> torch.Tensor:
    """Unnormalized H_n of each row of the (rows, n) tensor, as level one then level two."""
    level_one = butterflies(x, n, 1, min(micro, n) // 2)
    return butterflies(level_one, n, min(micro, n), n // 2)


def inv_sqrt(n: int) -> float:
    """fp32(1/sqrt(n)): exact for even powers of two."""
    return float(torch.tensor(1.0 / math.sqrt(n), dtype=torch.float32))


def _blocks(x: torch.Tensor, n: int) -> torch.Tensor:
    """Rows of n values in the precision the transform runs in: float64 for float64 input,
    float32 for the rest (the codec's precision)."""
    _check_size(n)
    if x.numel() % n:
        raise ValueError(f"FWHT of size {n} needs numel divisible by {n}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"FWHT needs a floating-point tensor, got {x.dtype}")
    return x.reshape(-1, n).to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _scale(n: int, dtype: torch.dtype) -> float:
    """1/sqrt(n) in the transform's precision (the codec's fp32 value for float32)."""
    return 1.0 / math.sqrt(n) if dtype == torch.float64 else inv_sqrt(n)


def _signs(signs, n: int, device, dtype: torch.dtype) -> torch.Tensor | None:
    if signs is None:
        return None
    if isinstance(signs, int):
        return fwht_signs(n, signs, device).to(dtype)
    signs = torch.as_tensor(signs, dtype=dtype, device=device)
    if signs.shape != (n,):
        raise ValueError(f"signs must have shape ({n},), got {tuple(signs.shape)}")
    return signs


def fwht(x: torch.Tensor, n: int, signs=None, micro: int = 16) -> torch.Tensor:
    """Orthonormal WHT over consecutive blocks of ``n`` values of the flattened tensor.

    Equals ``(x.view(-1, n) * signs) @ H_n / sqrt(n)`` with H_n in Sylvester order
    (``scipy.linalg.hadamard``).  ``signs``: None, a length-n tensor of +-1, or an
    integer seed (see fp4quant.format.random).  Computed in float64 for float64 input,
    else in float32 (as the codec does); the result has x's shape and dtype.
    """
    rows = _blocks(x, n)
    s = _signs(signs, n, rows.device, rows.dtype)
    if s is not None:
        rows = rows * s
    y = two_level_transform(rows, n, micro) * _scale(n, rows.dtype)
    return y.reshape(x.shape).to(x.dtype)


def ifwht(y: torch.Tensor, n: int, signs=None, micro: int = 16) -> torch.Tensor:
    """Inverse of fwht with the same ``signs``: H_n is symmetric and H_n H_n = n I."""
    rows = _blocks(y, n)
    x = two_level_transform(rows, n, micro) * _scale(n, rows.dtype)
    s = _signs(signs, n, rows.device, rows.dtype)
    if s is not None:
        x = x * s
    return x.reshape(y.shape).to(y.dtype)
