"""Fixtures of the native-kernel tests."""

from __future__ import annotations

import pytest
import torch

from fp4quant import ops, toolchain
from helpers import cuda_verdict, obey


@pytest.fixture(scope="session")
def native_cpu():
    if ops.backend("cpu") != "native":
        pytest.skip(f"native CPU kernels unavailable: {ops._native.unavailable_reason}")


def missing_cuda_kernels() -> str | None:
    """Why fp4quant's CUDA kernels are not in use (with torch on a GPU), or None."""
    if ops._native.module is None:
        return f"fp4quant._C is not loaded: {ops._native.unavailable_reason}"
    if not ops._native.module.with_cuda:
        return (f"fp4quant._C was built without CUDA kernels (nvcc: {ops._native.build_info.get('nvcc')}); rebuild "
                "with `make setup` or `pip install --no-build-isolation -e .`, which say why when they cannot")
    return None


@pytest.fixture(scope="session")
def cuda_native():
    """The CUDA kernels on a GPU: skipped without a GPU, failed where the GPU or the kernels are unusable."""
    sees_gpu = torch.cuda.is_available()
    obey(cuda_verdict(toolchain.nvidia_gpus(), sees_gpu, missing_cuda_kernels() if sees_gpu else None))
