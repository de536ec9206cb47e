"""Helpers shared by the tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def nmse(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Normalized mean squared error, in float64."""
    a, e = approx.double(), exact.double()
    return float(((a - e) ** 2).sum() / (e**2).sum().clamp_min(1e-300))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, except that any NaN equals any NaN (payloads are not part of the format)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    itype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a.masked_fill(nan_a, 0).view(itype), b.masked_fill(nan_b, 0).view(itype))
