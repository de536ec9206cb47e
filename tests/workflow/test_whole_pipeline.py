"""The whole pipeline at CI scale (workflow/config/ci.yaml), end to end in a temporary folder: every
figure and table, and their numbers against the results CSVs.  The suite's longest test: the
suite starts it first (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.tables import number
from test_workflow import FIGURES, REPO, SNAKEMAKE, snakemake


def table_rows(tex: Path, block: int = 0) -> list[list[str]]:
    """The body rows of a table's ``block``-th tabular."""
    body = tex.read_text().split("\\begin{tabular}")[1 + block].split("\\hline")[2]
    return [[c.strip().replace("\\_", "_") for c in line.rstrip("\\ ").split("&")]
            for line in body.strip().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # above snakemake's own 1500 s, which reports the log's tail
def test_whole_pipeline_at_ci_scale(tmp_path):
    r = snakemake("--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in FIGURES:
        pdf = tmp_path / "figures" / f"{name}.pdf"
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5000
        assert b"/Type3" not in pdf.read_bytes(), f"{name}.pdf embeds a Type 3 font"  # venues refuse them
    results = tmp_path / "data" / "ci" / "results"
    validation = pd.read_csv(results / "model_validation.csv")
    assert {"config", "component", "measured_s", "predicted_s", "rel_error"} <= set(validation.columns)
    assert {"compute", "codec", "communication", "total"} <= set(validation.component)
    assert (tmp_path / "data" / "ci" / "tests" / "junit.xml").read_text().count("testcase") > 5
    # the emulated all-reduce at the largest size beside the speedup its components predict
    prediction = pd.read_csv(results / "allreduce_prediction.csv")
    assert set(prediction.size_bytes) == {1048576} and prediction.algorithm.iloc[0] == "uncompressed"
    assert (prediction.predicted_s > 0).all() and prediction.ratio_rel_error.notna().all()

    # the tables' numbers are the CSVs' numbers: losses from the training runs, tokens/s from the
    # throughput runs (on the emulated cluster, or loopback where it cannot be built)
    training = pd.read_csv(results / "training.csv").set_index("comm")
    throughput = pd.read_csv(results / "throughput.csv").set_index("comm")
    assert (throughput.steps == 2).all() and (throughput.seq_len == 128).all()
    assert set(throughput.run.str.split("/").str[2]) == {"cluster"}  # data/ci/cluster/throughput/...
    # two experiments, two blocks of the table: (a) the throughput runs, (b) the training runs
    speed = {r[0]: r for r in table_rows(tmp_path / "paper/tables/end_to_end.tex", 0)}
    losses = {r[0]: r for r in table_rows(tmp_path / "paper/tables/end_to_end.tex", 1)}
    assert set(speed) == set(throughput.index) and set(losses) == set(training.index)
    for comm, t in throughput.iterrows():  # one seed at CI scale: the mean alone
        assert speed[comm][1:] == ["1", number(t.tokens_per_s, ".1f"), number(t.speedup_vs_bf16, ".3f")]
    for comm, t in training.iterrows():
        assert losses[comm][1:4] == ["1", number(t.final_loss, ".4f"), number(t.val_loss, ".4f")]
    regime = pd.read_csv(results / "regime.csv")
    assert set(zip(regime.source, regime.comm)) >= {("projected", "bf16"), ("predicted", "fp4quant"),
                                                    ("measured", "bf16"), ("measured", "fp4quant")}
    tex = table_rows(tmp_path / "paper/tables/regime.tex")
    assert [r[5:] for r in tex] == [[number(100 * r[f"{c}_share"], ".0f") for c in ("compute", "codec", "bandwidth",
                                                                                  "latency")]
                                    for _, r in regime.iterrows()]
    error = pd.read_csv(results / "error.csv")
    presets = error[error.study == "presets"]
    for row in table_rows(tmp_path / "paper/tables/formats.tex"):
        g = presets[presets.config == row[0]].sort_values("kind")
        assert row[1] == number(g.bits_per_value.iloc[0], ".3f")
        assert row[3:] == [number(v, ".2f") for v in g.sqnr_db]
    ablation = pd.read_csv(results / "ablation.csv")
    tex = table_rows(tmp_path / "paper/tables/ablation.tex")
    assert len(tex) == len(ablation)
    for row, a in zip(tex, ablation.itertuples()):
        if a.change_unit == "identical bytes":  # naive_pack's training: fp4quant's bytes, no run
            assert a.ablation == "naive_pack" and row == [a.ablation, a.measure, "--", "--", "none (identical bytes)"]
            continue
        change = (number(a.change, "+.2f") + " dB" if a.change_unit == "dB"
                  else number(100 * a.change, "+.1f") + "\\%")
        low, high = getattr(a, "change_low", float("nan")), getattr(a, "change_high", float("nan"))
        if pd.notna(low):  # a kernel row: the range its slowest and fastest runs allow
            change += f" [{number(100 * low, '+.1f')}\\%, {number(100 * high, '+.1f')}\\%]"
        seeds, sd = getattr(a, "seeds", float("nan")), getattr(a, "fp4quant_seed_sd", float("nan"))
        if pd.notna(seeds):  # a training row: its seeds, beside fp4quant's own spread over its seeds
            noise = f"; fp4quant's seeds: SD {number(100 * sd, '.1f')}\\%" if pd.notna(sd) else ""
            change += f" ({int(seeds)} seed{'s' if seeds != 1 else ''}{noise})"
        assert a.change_unit == ("dB" if a.measure.startswith("sqnr_db/") else "relative")
        assert row == [a.ablation, a.measure, number(a.fp4quant, ".4g"), number(a.ablated, ".4g"), change]
    assert "nan" not in (tmp_path / "paper/tables/ablation.tex").read_text().replace("provenance", "")
    packing = pd.read_csv(results / "ablation_naive_pack.csv")  # the kernels of both packings, op by op
    assert set(packing.op) == {"quantize", "dequantize", "dequantize_reduce"} and packing.speed_over_naive.notna().all()
    assert not (results.parent / "runs/tiny/naive_pack").exists()

    # a rerun has nothing to do; removing one output redoes just what depends on it
    r = snakemake("-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path)
    assert "Nothing to be done" in r.stdout + r.stderr
    (tmp_path / "figures" / "error.pdf").unlink()
    r = snakemake("-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path)
    assert "figure" in r.stdout and "train " not in r.stdout

    # results carry the commit that computed them: at another commit everything is computed again
    env = {**os.environ, "GIT_DIR": str(tmp_path / "no-git"), "FP4QUANT_COMMIT": "0" * 40}
    r = subprocess.run([*SNAKEMAKE, "-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "Params have changed since last execution" in r.stdout
    for rule in ("build_extension", "prepare_data", "train", "cluster_train", "collect_results", "collect_throughput",
                 "regime", "figure", "table"):
        assert f"rule {rule}:" in r.stdout
