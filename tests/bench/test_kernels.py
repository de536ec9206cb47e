"""The kernel benchmark runs and writes what it promises (speed itself is not a test)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from fp4quant.bench import kernels
from fp4quant.format.config import QuantConfig
from fp4quant.format.packed import layout


def test_quick_run_writes_csv_limits_and_summary(tmp_path):
    out = tmp_path / "k.csv"
    assert kernels.main(["--quick", "--threads", "1,2", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert {"copy", "clone", "quantize", "dequantize", "dequantize_reduce"} <= set(df.op)
    assert {"torch", "reference", "torchao"} <= set(df.impl)
    assert set(df.threads) == {1, 2}
    assert (df.gbps > 0).all() and df.hardware.str.contains("CPU").all()
    assert (df.gbps_min <= df.gbps).all() and (df.gbps <= df.gbps_max).all()
    # each op's calls were paired with copies of its size and thread count; the conservative
    # fraction_best follows from the fastest of them and the bytes the op moves
    for (size, threads), g in df.groupby(["size_bytes", "threads"]):
        copy = g[g.op == "copy"].iloc[0]
        traffic_best = 2 * copy.gbps_max * 1e9
        ops = g[g.op != "copy"]
        assert copy.iters == ops.iters.sum()  # one copy per timed call of an op
        for r in ops.itertuples():
            processed = size * (kernels.WORLD if r.op == "dequantize_reduce" else 1)
            assert r.fraction_min <= r.fraction <= r.fraction_max
            assert r.fraction_best == pytest.approx(r.gbps_max / (traffic_best * processed / r.bytes_moved / 1e9))
            assert r.limit_gbps <= traffic_best * processed / r.bytes_moved / 1e9 * (1 + 1e-9)
            assert r.format_fraction == pytest.approx(r.fraction * r.format_bytes_moved / r.bytes_moved)
    q = df[(df.op == "quantize") & (df.impl == "native") & (df.preset == "fp4quant")].iloc[0]
    assert q.bytes_moved == q.format_bytes_moved == 4 * q.numel + layout(q.numel, QuantConfig.preset("fp4quant")).nbytes
    # one scale for the whole tensor: the format reads its input twice, and its floor says so
    nv = df[(df.op == "quantize") & (df.impl == "native") & (df.preset == "nvfp4")].iloc[0]
    message = layout(nv.numel, QuantConfig.preset("nvfp4")).nbytes
    assert (nv.bytes_moved, nv.format_bytes_moved) == (4 * nv.numel + message, 8 * nv.numel + message)
    assert nv.format_fraction > nv.fraction
    meta = json.loads((tmp_path / "k.csv.meta.json").read_text())
    assert meta["summary"]["fp4quant_over_reference"] > 1 and meta["threads"] == [1, 2]
    assert len(meta["load_average_before"]) == 3 and meta["cpu_isa"]
    assert 0 < meta["summary"]["fp4quant_quantize_fraction"]


def test_bad_thread_counts_are_refused():
    with pytest.raises(SystemExit):
        kernels.main(["--threads", "0", "--quick"])


def test_max_mib_keeps_the_smaller_sizes_and_refuses_none(tmp_path, capsys):
    out = tmp_path / "k.csv"
    assert kernels.main(["--quick", "--threads", "1", "--max-mib", "1", "--out", str(out)]) == 0
    assert set(pd.read_csv(out).size_bytes) == set(kernels.QUICK_SIZES)
    with pytest.raises(SystemExit):
        kernels.main(["--quick", "--max-mib", "0", "--out", str(out)])
    assert "--max-mib 0 leaves no size to measure" in capsys.readouterr().err


def test_paired_timer_alternates_which_call_goes_first():
    calls: list[str] = []
    times, copies = kernels.paired_timer(torch.device("cpu"), lambda: calls.append("op"), lambda: calls.append("copy"),
                                         min_time=0.0, max_iters=9)
    assert len(times) == len(copies) == 5
    assert calls[:2] == ["op", "copy"]  # the warm-up calls
    assert calls[2:] == ["op", "copy", "copy", "op"] * 2 + ["op", "copy"]


def test_dtypes_add_a_dtype_column_and_the_fp8_cast_anchor(tmp_path):
    """float32 and bfloat16 inputs of the same byte sizes: one row per (op, impl, preset, dtype,
    size, threads), bfloat16 rows holding twice the values and moving 2 bytes per value."""
    out = tmp_path / "k.csv"
    assert kernels.main(["--quick", "--threads", "1", "--dtypes", "float32,bfloat16", "--max-mib", "1",
                         "--out", str(out)]) == 0
    df = pd.read_csv(out)
    df["preset"] = df.preset.fillna("")
    assert set(df.dtype) == {"float32", "bfloat16"}
    assert not df.duplicated(["op", "impl", "preset", "dtype", "size_bytes", "threads"]).any()
    for size in kernels.QUICK_SIZES:
        at = df[df.size_bytes == size].set_index(["op", "impl", "preset", "dtype"])
        assert at.loc[("copy", "torch", "", "bfloat16")].numel == 2 * at.loc[("copy", "torch", "", "float32")].numel
        q = at.loc[("quantize", "native", "fp4quant", "bfloat16")]
        assert q.bytes_moved == 2 * q.numel + layout(q.numel, QuantConfig.preset("fp4quant")).nbytes
        cast = at.loc[("cast_fp8", "torch", "e4m3fn", "float32")]
        assert cast.bytes_moved == 5 * cast.numel and cast.gbps > 0
    meta = json.loads((tmp_path / "k.csv.meta.json").read_text())
    assert meta["dtypes"] == ["float32", "bfloat16"] and set(meta["summaries"]) == {"float32", "bfloat16"}
    assert meta["summary"]["dtype"] == "float32" and meta["summaries"]["bfloat16"]["cast_fp8_gbps"] > 0
    assert meta["torchao"] != "absent"  # installed with the test dependencies


def test_one_thread_count_on_cuda_by_default():
    assert kernels.thread_list(None, "cuda") == [1]
    assert kernels.thread_list(None, "cpu") == sorted({1, torch.get_num_threads()})
    assert kernels.thread_list("1,4", "cuda") == [1, 4]


def test_bad_dtypes_are_refused(capsys):
    with pytest.raises(SystemExit):
        kernels.main(["--quick", "--dtypes", "float64"])
    assert "--dtypes wants some of float32, bfloat16, float16" in capsys.readouterr().err
