"""The naive-packing ablation: a kernel ablation (same bytes as fp4quant, so no training run) from
the kernel benchmark's rows of both packings, and its rows of the ablation table."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fp4quant import ops
from fp4quant.analysis import collect, tables
from fp4quant.analysis.__main__ import main
from fp4quant.format.config import PRESETS, QuantConfig
from fp4quant.provenance import atomic_write_csv
from fp4quant.reference import codec as reference

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}
MiB = 1 << 20


def kernel_frame(device: str = "cpu", spread: bool = True) -> pd.DataFrame:
    """A small kernel benchmark CSV: two sizes, two thread counts, three ops of fp4quant and
    naive_pack (naive 20% slower at 4 MiB on 2 threads), with the rows a real one holds beside them."""
    rows = []
    for threads in (1, 2):
        for size in (MiB, 4 * MiB):
            for op in ("quantize", "dequantize", "dequantize_reduce"):
                for preset, gbps in (("fp4quant", 10.0), ("naive_pack", 10.0 if size == MiB or threads == 1 else 8.0),
                                     ("no_fwht", 20.0)):
                    row = {"op": op, "impl": "native", "preset": preset, "size_bytes": size, "numel": size // 4,
                           "threads": threads, "gbps": gbps, "iters": 9, "device": device, **ORIGIN}
                    if spread:
                        row.update(gbps_min=0.9 * gbps, gbps_max=1.1 * gbps, fraction=gbps / 40,
                                   fraction_min=0.95 * gbps / 40, fraction_max=1.05 * gbps / 40)
                    rows.append(row)
            rows.append({"op": "quantize", "impl": "reference", "preset": "fp4quant", "size_bytes": size,
                         "numel": size // 4, "threads": threads, "gbps": 0.05, "iters": 3, "device": device, **ORIGIN})
            rows.append({"op": "copy", "impl": "torch", "preset": "", "size_bytes": size, "numel": size // 4,
                         "threads": threads, "gbps": 20.0, "iters": 30, "device": device, **ORIGIN})
    return pd.DataFrame(rows).assign(profile="cpu", cpu_isa="avx512")


def test_only_naive_pack_writes_fp4quants_bytes():
    assert [name for name in PRESETS if collect.identical_bytes(name)] == ["naive_pack"]
    assert not collect.identical_bytes("fp4quant") and not collect.identical_bytes("no_such_preset")


@pytest.mark.parametrize("n", [4096, 5000, 3 * 2048 + 17])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_naive_and_warp_packing_write_identical_bytes(n, rounding):
    """The reason naive_pack trains nothing: its messages are fp4quant's byte for byte (on every
    backend here: the reference and, where built, the native kernels)."""
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n)) * 3
    warp, naive = (QuantConfig.preset(p, rounding=rounding) for p in ("fp4quant", "naive_pack"))
    assert torch.equal(reference.quantize_rows(x, warp, 5, 7), reference.quantize_rows(x, naive, 5, 7))
    ours = ops.quantize_rows(x, warp, 5, 7)
    assert torch.equal(ours, ops.quantize_rows(x, naive, 5, 7))
    assert torch.equal(ops.dequantize_reduce(ours, n, warp, torch.float32, True, 5, 7),
                       ops.dequantize_reduce(ours, n, naive, torch.float32, True, 5, 7))


def test_packing_pairs_both_presets_with_the_ratio_and_its_spread():
    df = collect.packing(kernel_frame())
    # one row per op, size and thread count: the native kernels of both presets only
    assert len(df) == 2 * 2 * 3 and set(df.impl) == {"native"} and set(df.ablation) == {"naive_pack"}
    assert not df.duplicated(["op", "size_bytes", "threads"]).any()
    assert list(df.op[:3]) == ["quantize", "dequantize", "dequantize_reduce"]
    r = df[(df.op == "quantize") & (df.size_bytes == 4 * MiB) & (df.threads == 2)].iloc[0]
    assert (r.fp4quant_gbps, r.naive_pack_gbps) == (10.0, 8.0)
    # fp4quant's speed over the naive packing's: > 1 where warp packing is faster
    assert r.speed_over_naive == pytest.approx(1.25)
    assert r.speed_over_naive_low == pytest.approx(9.0 / 8.8) and r.speed_over_naive_high == pytest.approx(11.0 / 7.2)
    assert r.paired_speed_over_naive == pytest.approx(1.25)
    assert r.paired_speed_over_naive_low == pytest.approx(0.95 / 1.05 * 1.25)
    assert r.paired_speed_over_naive_high == pytest.approx(1.05 / 0.95 * 1.25)
    same = df[df.size_bytes == MiB]
    assert (same.speed_over_naive == 1.0).all()
    # the provenance every result carries, and what the two kernels differ in (on a CPU: nothing)
    assert {**ORIGIN, "cpu_isa": "avx512", "device": "cpu", "profile": "cpu"}.items() <= r.to_dict().items()
    assert "same code" in r.kernels_differ_in and "A/A" in r.kernels_differ_in
    assert "stored" in collect.packing(kernel_frame("cuda")).kernels_differ_in.iloc[0]


def test_packing_of_an_older_benchmark_leaves_out_what_it_did_not_record():
    df = collect.packing(kernel_frame(spread=False))
    assert "speed_over_naive" in df and "speed_over_naive_low" not in df
    assert not any(c.startswith("paired_") for c in df)


def test_packing_refuses_what_it_cannot_compare():
    with pytest.raises(ValueError, match="not a preset that writes fp4quant's bytes"):
        collect.packing(kernel_frame(), "no_fwht")
    k = kernel_frame()
    with pytest.raises(ValueError, match="no rows of naive_pack"):
        collect.packing(k[k.preset != "naive_pack"])


def ablation_of_naive_pack() -> pd.DataFrame:
    error = pd.DataFrame([{**ORIGIN, "study": "presets", "kind": k, "config": c, "sqnr_db": v}
                          for k, v in (("gaussian", 20.43), ("outlier_channels", 19.87))
                          for c in ("fp4quant", "naive_pack", "no_fwht")])
    runs = pd.DataFrame([{**ORIGIN, "comm": "fp4quant", "series": "fp4quant", "seed": 0, "final_loss": 2.5,
                          "val_loss": 2.6, "tokens_per_s": 100.0}])  # no naive_pack run: it trains nothing
    return collect.ablation("naive_pack", error, kernel_frame(), runs)


def test_the_ablation_rows_of_naive_pack():
    df = ablation_of_naive_pack().set_index("measure")
    assert (df.loc[["sqnr_db/gaussian", "sqnr_db/outlier_channels"], "change"] == 0).all()
    # its kernel speed is the packing table's at the largest size on all threads
    k = df.loc[f"quantize_gbps/{4 * MiB}"]
    p = collect.packing(kernel_frame()).set_index(["op", "size_bytes", "threads"]).loc[("quantize", 4 * MiB, 2)]
    assert (k.fp4quant, k.ablated) == (p.fp4quant_gbps, p.naive_pack_gbps)
    assert k.change == pytest.approx(1 / p.speed_over_naive - 1) and k.change_unit == "relative"
    assert k.change_low == pytest.approx(1 / p.speed_over_naive_high - 1)
    assert k.change_high == pytest.approx(1 / p.speed_over_naive_low - 1)
    assert "same code" in k.kernels_differ_in
    t = df.loc["training"]
    assert t.change_unit == "identical bytes" and pd.isna(t.fp4quant) and pd.isna(t.ablated)
    assert set(df.commit) == {ORIGIN["commit"]}


def test_the_ablation_table_shows_naive_pack_without_nan(tmp_path):
    csv = tmp_path / "ablation.csv"
    atomic_write_csv(csv, ablation_of_naive_pack().to_dict("records"))  # as collect writes it and table reads it
    out = tmp_path / "ablation.tex"
    tables.ablation(pd.read_csv(csv), out, "cpu")
    tex = out.read_text()
    body = tex.split("\\hline")[2]
    rows = {line.split("&")[1].strip(): [c.strip() for c in line.rstrip("\\ ").split("&")]
            for line in body.strip().splitlines()}
    assert rows["training"] == ["naive\\_pack", "training", "--", "--", "none (identical bytes)"]
    assert rows["sqnr\\_db/gaussian"][2:] == ["20.43", "20.43", "+0.00 dB"]
    assert rows[f"quantize\\_gbps/{4 * MiB}"][2:] == ["10", "8", r"-20.0\% [-34.5\%, -2.2\%]"]
    assert "nan" not in tex.replace("provenance", "")
    assert "same code" in tex and "data/cpu/results/ablation\\_naive\\_pack.csv" in tex


def test_the_ablation_step_writes_the_naive_pack_csv_from_the_kernels_alone(tmp_path):
    kernels = tmp_path / "kernels.csv"
    atomic_write_csv(kernels, kernel_frame().drop(columns="profile").to_dict("records"))
    out = tmp_path / "ablation_naive_pack.csv"
    assert main(["ablation", "naive_pack", "--profile", "cpu", "--kernels", str(kernels), "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert len(df) == 12 and {"speed_over_naive", "hardware", "commit", "torch"} <= set(df)
    # an ablation that trains still needs its runs and the error benchmark
    assert main(["ablation", "no_fwht", "--profile", "cpu", "--kernels", str(kernels),
                 "--out", str(tmp_path / "x.csv")]) == 2
