"""The CPU kernels run on torch's threads (OpenMP, one runtime) and give the same bytes on any number of them."""

from __future__ import annotations

import re

import pytest
import torch

from fp4quant import QuantConfig, ops
from fp4quant.format.config import PRESETS
from fp4quant.reference import codec as reference

pytestmark = pytest.mark.usefixtures("native_cpu")

# enough spans for every thread at the kernels' grain (2**15 values per chunk), and a ragged tail
N = 5 * (1 << 15) + 4099


@pytest.fixture
def threads():
    """Run a test at several torch thread counts, restoring the count afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_kernel_region_runs_on_torch_threads(threads, count):
    """The extension reports the team its last parallel region ran on: torch's thread count, not 1."""
    threads(count)
    x = torch.randn(1, N)
    msg = ops.quantize_rows(x, QuantConfig())
    assert ops._native.module.last_parallel_threads() == count
    ops.dequantize_rows(msg, N, QuantConfig(), torch.float32)
    assert ops._native.module.last_parallel_threads() == count
    ops.dequantize_reduce(torch.cat([msg, msg]), N, QuantConfig(), torch.float32, True)
    assert ops._native.module.last_parallel_threads() == count


def test_one_openmp_runtime_in_the_process():
    """The extension links torch's OpenMP runtime: one runtime (one thread pool) is mapped."""
    maps = open("/proc/self/maps").read()
    runtimes = {m for m in re.findall(r"(/\S*/lib(?:g?omp|iomp5)[^/\s]*\.so[.\d]*)", maps)}
    assert len(runtimes) == 1, runtimes
    assert ops._native.build_info.get("openmp") in runtimes


COMPRESSED = sorted(p for p in PRESETS if p != "bf16")


@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_same_bytes_on_any_thread_count(threads, name, rounding):
    """Every op gives the same bytes on 1, 2 and 3 threads, and they are the reference's."""
    config = QuantConfig.preset(name, rounding=rounding)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, N, generator=g) * torch.tensor([[1e-3], [1e3]])
    x[0, 77] = float("nan")
    results = []
    for count in (1, 2, 3):
        threads(count)
        msg = ops.quantize_rows(x, config, 5, 11)
        assert ops._native.module.last_parallel_threads() == count
        results.append((msg, ops.dequantize_rows(msg, N, config, torch.float32),
                        ops.dequantize_reduce(msg, N, config, torch.float32, True, 6, 11),
                        ops.dequantize_reduce(msg, N, config, torch.float32, False, 6, 11)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(results[0][0], reference.quantize_rows(x, config, 5, 11))
