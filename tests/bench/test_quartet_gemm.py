"""The Quartet GEMM benchmark (bench.quartet_gemm): exact and Quartet side by side, with provenance."""

from __future__ import annotations

import json

import pandas as pd

from fp4quant.bench import quartet_gemm


def test_it_times_both_impls_per_layer_and_writes_provenance(tmp_path):
    out = tmp_path / "compute.csv"
    assert quartet_gemm.main(["--out", str(out), "--tokens", "32", "--repeats", "2"]) == 0
    df = pd.read_csv(out)
    assert len(df) == 2 * len(quartet_gemm.TINY_TP2) and set(df.impl) == {"exact", "quartet"}
    assert (df.min_s <= df.median_s).all() and (df.median_s <= df.max_s).all()
    assert (df[df.impl == "exact"].slowdown_vs_exact == 1.0).all()
    meta = json.loads((tmp_path / "compute.csv.meta.json").read_text())
    assert meta["kind"] == "measured" and meta["threads"] == 1 and {"hardware", "commit", "torch"} <= set(df.columns)
