"""Result tables: changes in their units, spreads over seeds, paired comparisons."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp4quant.analysis import collect, tables

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def runs(rows) -> pd.DataFrame:
    return pd.DataFrame([{**ORIGIN, "comm": c, "series": c, "seed": s, "final_loss": f, "val_loss": f + 0.1, "tokens_per_s": t}
                         for c, s, f, t in rows])


def test_ablation_sqnr_changes_in_db_the_rest_relative_and_paired_by_seed():
    error = pd.DataFrame([{**ORIGIN, "study": "presets", "kind": "gaussian", "config": c, "sqnr_db": v}
                          for c, v in (("fp4quant", 20.0), ("no_fwht", 27.5))])
    kernels = pd.DataFrame(columns=["op", "impl", "preset", "size_bytes", "gbps", *ORIGIN])
    r = runs([("fp4quant", 0, 2.0, 100.0), ("fp4quant", 1, 3.0, 300.0), ("no_fwht", 0, 2.2, 110.0)])
    df = collect.ablation("no_fwht", error, kernels, r).set_index("measure")
    assert df.loc["sqnr_db/gaussian", "change"] == pytest.approx(7.5)
    assert df.loc["sqnr_db/gaussian", "change_unit"] == "dB"
    # seed 1 has no ablated run: the comparison uses seed 0 only
    assert df.loc["final_loss", "fp4quant"] == 2.0 and df.loc["final_loss", "change"] == pytest.approx(0.1)
    assert df.loc["tokens_per_s", "change_unit"] == "relative"
    rows = {r.measure: r for r in df.reset_index().itertuples()}
    assert tables.change(rows["sqnr_db/gaussian"]) == "+7.50 dB"
    # one seed compared: said so, beside fp4quant's own spread over its seeds (2.0, 3.0: SD 28.3% of the mean)
    assert tables.change(rows["final_loss"]) == r"+10.0\% (1 seed; fp4quant's seeds: SD 28.3\%)"


def test_ablation_kernel_speed_compares_native_kernels_not_the_reference():
    error = pd.DataFrame([{**ORIGIN, "study": "presets", "kind": "gaussian", "config": c, "sqnr_db": 20.0}
                          for c in ("fp4quant", "no_fwht")])
    # the benchmark times the pure-PyTorch reference (fp4quant only) beside the kernels
    kernels = pd.DataFrame([{**ORIGIN, "op": "quantize", "impl": i, "preset": p, "size_bytes": 1 << 26, "threads": 2, "gbps": g}
                            for i, p, g in (("reference", "fp4quant", 0.03), ("native", "fp4quant", 9.0),
                                            ("native", "no_fwht", 13.5))])
    r = runs([("fp4quant", 0, 2.0, 100.0), ("no_fwht", 0, 2.1, 100.0)])
    df = collect.ablation("no_fwht", error, kernels, r).set_index("measure")
    assert df.loc[f"quantize_gbps/{1 << 26}", "fp4quant"] == 9.0
    assert df.loc[f"quantize_gbps/{1 << 26}", "change"] == pytest.approx(0.5)


def test_end_to_end_reports_mean_and_sd_over_seeds(tmp_path):
    r = runs([("bf16", s, 2.4 + 0.01 * s, 700.0 + s) for s in range(3)]
             + [("fp4quant", s, 2.5 + 0.02 * s, 2000.0 + 10 * s) for s in range(3)])
    r = r.assign(model="tiny", tp=2, dp=1, steps=300, fwd_bytes_sent=1.0, bwd_bytes_sent=1.0,
                 speedup_vs_bf16=r.tokens_per_s / r.seed.map({s: 700.0 + s for s in range(3)}))
    out = tmp_path / "e2e.tex"
    tables.end_to_end(r, out, "cpu")
    tex = out.read_text()
    # two experiments, two blocks: (a) tokens/s and speedup, (b) the training runs' losses
    speed, training = ([[c.strip() for c in line.rstrip("\\ ").split("&")] for line in block.splitlines()
                        if line.startswith("fp4quant")] for block in tex.split("\\begin{tabular}")[1:])
    speedup = r[r.comm == "fp4quant"].speedup_vs_bf16
    assert speed == [["fp4quant", "3", "2010.0 $\\pm$ 10.0",
                      f"{speedup.mean():.3f} $\\pm$ {speedup.std(ddof=1):.3f}"]], speed
    assert training == [["fp4quant", "3", "2.5200 $\\pm$ 0.0200", "2.6200 $\\pm$ 0.0200", "0.000"]], training
    assert "last 10 steps" in tex and "sample SD" in tex and "(a) TP comm" in tex and "(b) TP comm" in tex
    assert tables.mean_sd(pd.Series([1.5]), ".2f") == "1.50"
    assert tables.mean_sd(pd.Series([1.0, float("nan"), 3.0]), ".1f") == "2.0 $\\pm$ 1.4 (2 of 3)"  # n counts 3
    # throughput runs (unpaired repeats): the speedup's SD carries BF16's spread too
    fast = r.assign(speedup_vs_bf16=r.tokens_per_s / r[r.comm == "bf16"].tokens_per_s.mean(), warmup_steps=1,
                    seq_len=512, batch_size=8, network="emulated")
    tables.end_to_end(r, out, "cpu", fast)
    cell = [line for line in out.read_text().split("\\begin{tabular}")[1].splitlines() if line.startswith("fp4quant")]
    a, b = fast[fast.comm == "fp4quant"].tokens_per_s, fast[fast.comm == "bf16"].tokens_per_s
    sd = a.mean() / b.mean() * ((a.std() / a.mean()) ** 2 + (b.std() / b.mean()) ** 2) ** 0.5
    assert cell[0].rstrip("\\ ").split("&")[3].strip() == f"{a.mean() / b.mean():.3f} $\\pm$ {sd:.3f}", cell


def test_the_formats_caption_states_the_sqnrs_spread_over_seeds(tmp_path):
    rows = [{**ORIGIN, "study": "presets", "config": c, "kind": k, "bits_per_value": b, "sqnr_db": -10 * math.log10(m),
             "nmse": m, "nmse_std": sd, "seeds": 3}
            for c, b, m, sd in (("bf16", 16.0, 1e-5, 1e-7), ("fp4quant", 4.5, 1e-2, 1e-3)) for k in ("gaussian",)]
    out = tmp_path / "formats.tex"
    tables.formats(pd.DataFrame(rows), out, "cpu")
    sd = 10 / math.log(10) * 1e-3 / 1e-2  # fp4quant's: the larger
    assert f"Mean over 3 seeds' tensors; the largest SD of any cell: {sd:.2f} dB." in out.read_text()
    one = pd.DataFrame(rows).assign(seeds=1, nmse_std=float("nan"))
    tables.formats(one, out, "cpu")
    assert "One tensor a kind: no spread." in out.read_text() and " nan" not in out.read_text().lower()
