"""The two-shot codec pipeline benchmark runs on a CPU at small sizes and writes what it promises."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fp4quant.bench import pipeline
from fp4quant.comm import plan
from fp4quant.format.config import QuantConfig
from fp4quant.format.packed import layout

KiB, MiB = 1 << 10, 1 << 20


def test_quick_run_writes_stages_per_world_size_and_dtype(tmp_path):
    out = tmp_path / "p.csv"
    assert pipeline.main(["--quick", "--worlds", "2,4,8", "--sizes", "256K,1M", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert len(df) == 3 * 2 * 2 and not df.duplicated(["preset", "dtype", "world", "size_bytes"]).any()
    assert set(df.world) == {2, 4, 8} and set(df.dtype) == {"float32", "bfloat16"} and set(df.preset) == {"fp4quant"}
    assert {"device", "backend", "hardware", "torch", "commit"} <= set(df.columns) and set(df.device) == {"cpu"}
    for stage in ("quantize_s", "reduce_s", "dequantize_s", "total_s", "copy_s"):
        assert (df[stage] > 0).all(), stage
    assert list(df.gbps) == pytest.approx(list(df.size_bytes / df.total_s / 1e9))
    config = QuantConfig.preset("fp4quant")
    for r in df.itertuples():
        itemsize = 4 if r.dtype == "float32" else 2
        assert r.numel == r.size_bytes // itemsize
        assert r.shard_values == plan.shard_values(r.numel, r.world, config.block)
        assert r.message_bytes == layout(r.shard_values, config).nbytes
        m = r.message_bytes
        assert r.bytes_moved == 2 * itemsize * r.numel + r.world * m + (r.world + 1) * m + r.world * m
        assert r.iters >= 5
    meta = json.loads((tmp_path / "p.csv.meta.json").read_text())
    assert meta["worlds"] == [2, 4, 8] and meta["stages"] == ["quantize", "reduce", "dequantize"]
    assert meta["hardware"] and meta["commit"]


def test_a_tensor_that_is_no_whole_number_of_blocks_per_rank_is_padded(tmp_path):
    out = tmp_path / "p.csv"
    assert pipeline.main(["--quick", "--worlds", "3", "--sizes", "100K", "--dtypes", "float32", "--out", str(out)]) == 0
    r = pd.read_csv(out).iloc[0]
    assert r.numel == 25600 and r.shard_values * 3 >= r.numel and r.shard_values % 2048 == 0


@pytest.mark.parametrize("token,size", [("256K", 256 * KiB), ("8M", 8 * MiB), ("1G", 1 << 30), ("4096", 4096),
                                        ("1.5MiB", 3 * MiB // 2)])
def test_sizes_read_with_units(token, size):
    assert pipeline.parse_size(token) == size


@pytest.mark.parametrize("args", [["--worlds", "0"], ["--sizes", "-1M"], ["--sizes", "lots"], ["--dtypes", "int8"],
                                  ["--presets", "bf16"], ["--presets", "nope"]])
def test_bad_arguments_are_refused(args, tmp_path):
    with pytest.raises(SystemExit):
        pipeline.main(["--quick", *args, "--out", str(tmp_path / "p.csv")])
