"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import pytest
import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def nmse(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Normalized mean squared error, in float64."""
    a, e = approx.double(), exact.double()
    return float(((a - e) ** 2).sum() / (e**2).sum().clamp_min(1e-300))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
