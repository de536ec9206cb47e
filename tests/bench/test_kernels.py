"""The kernel benchmark runs and writes what it promises (speed itself is not a test)."""

from __future__ import annotations

import json

import pandas as pd

from fp4quant.bench import kernels


def test_quick_run_writes_csv_and_summary(tmp_path):
    out = tmp_path / "k.csv"
    assert kernels.main(["--quick", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert {"clone", "quantize", "dequantize", "dequantize_reduce"} <= set(df.op)
    assert {"torch", "reference", "torchao"} <= set(df.impl)
    assert (df.gbps > 0).all() and df.hardware.str.contains("CPU").all()
    meta = json.loads((tmp_path / "k.csv.meta.json").read_text())
    assert meta["summary"]["fp4quant_over_reference"] > 1
