"""Shared fixtures of the test suite (plain helpers live in helpers.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
