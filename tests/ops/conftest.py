"""Fixtures of the native-kernel tests."""

from __future__ import annotations

import pytest

from fp4quant import ops


@pytest.fixture(scope="session")
def native_cpu():
    if ops.backend("cpu") != "native":
        pytest.skip(f"native CPU kernels unavailable: {ops._native.unavailable_reason}")
