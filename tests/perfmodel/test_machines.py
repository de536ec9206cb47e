"""The H100 machine's codec rates from a CUDA kernel benchmark: of BF16 input where measured
(what the all-reduce carries), each dtype's GB/s divided by its own bytes a value."""

from __future__ import annotations

import pandas as pd
import pytest

from fp4quant.perfmodel import machines


def kernels_csv(path, rows):
    pd.DataFrame([{"impl": "native", "device": "cuda", "preset": "fp4quant", "op": op, "dtype": dtype,
                   "size_bytes": size, "gbps": gbps} for op, dtype, size, gbps in rows]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("order", [1, -1])
def test_bf16_rows_are_used_at_two_bytes_a_value_whatever_the_row_order(tmp_path, order):
    rows = [("quantize", "float32", 1 << 28, 100.0), ("quantize", "bfloat16", 1 << 28, 60.0),
            ("quantize", "bfloat16", 1 << 20, 10.0), ("dequantize_reduce", "bfloat16", 1 << 28, 80.0)]
    rates = machines.gpu_codec(kernels_csv(tmp_path / "k.csv", rows[::order]))["fp4quant"]
    assert rates["quantize"] == pytest.approx(60e9 / 2)  # the largest size, BF16: 30 Gvalues/s
    assert rates["dequantize_reduce"] == pytest.approx(80e9 / 2 / 2)


def test_float32_only_benchmarks_count_four_bytes_and_an_empty_one_is_refused(tmp_path):
    rates = machines.gpu_codec(kernels_csv(tmp_path / "k.csv", [("quantize", "float32", 1 << 28, 100.0)]))
    assert rates["fp4quant"]["quantize"] == pytest.approx(25e9)
    cpu = tmp_path / "cpu.csv"
    pd.DataFrame([{"impl": "native", "device": "cpu", "preset": "fp4quant", "op": "quantize", "dtype": "float32",
                   "size_bytes": 1, "gbps": 1.0}]).to_csv(cpu, index=False)
    with pytest.raises(ValueError, match="no native CUDA kernel rows"):
        machines.gpu_codec(cpu)
