"""The step breakdown (trainer's split timers), the emulated all-reduce figure with its band,
the model validation figure and table: built from small fixtures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fp4quant.analysis import collect, figures, tables
from fp4quant.analysis.origin import read_stamp
from fp4quant.perfmodel import model_validation

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def make_run(path, comm, seed=0, steps=10, split=True):
    path.mkdir(parents=True)
    lines = []
    for i in range(steps):
        r = {"step": i, "step_time_s": 0.1 + 0.01 * (i % 2)}
        for d in ("fwd", "bwd"):
            q, dq = (0.001, 0.002) if comm != "bf16" else (0.0, 0.0)
            r.update({f"{d}_comm_s": 0.02, f"{d}_quantize_s": q, f"{d}_dequantize_s": dq})
            if split:
                r[f"{d}_codec_s"] = q + dq
        lines.append(json.dumps(r))
    (path / "log.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps({"provenance": {**ORIGIN, "config": {
        "comm": comm, "seed": seed, "model": "tiny"}}}))
    (path / "cluster.json").write_text(json.dumps({"emulated": True, "nodes": 2, "link_rate_mbit": 60.0}))
    return path


def test_breakdown_parts_sum_to_the_step_and_skip_the_first_steps(tmp_path):
    runs = [make_run(tmp_path / f"{c}{s}", c, s) for c in ("bf16", "fp4quant") for s in (0, 1)]
    df = collect.breakdown(runs, "cpu", warmup=2)
    assert set(df.part) == set(collect.BREAKDOWN_PARTS) and df.step.min() == 2  # the warm-up steps left out
    per_step = df.groupby(["run", "step"]).seconds.sum()
    want = {i: 0.1 + 0.01 * (i % 2) for i in range(10)}
    assert all(v == pytest.approx(want[step]) for (_, step), v in per_step.items())
    fp4 = df[(df.series == "fp4quant")].groupby("part").seconds.mean()
    assert fp4["quantize"] == pytest.approx(0.002) and fp4["dequantize"] == pytest.approx(0.004)
    assert fp4["wire"] == pytest.approx(0.04)
    assert df.network.iloc[0] == "emulated 2 nodes, 60 Mbit/s links, latency not shaped"
    record = tmp_path / "dilated.json"  # fully dilated: the latency is slept, and the label says so
    record.write_text(json.dumps({"emulated": True, "nodes": 2, "link_rate_mbit": 50.3, "latency_shaped": False,
                                  "dilation": {"latency_injected_s": 0.0795}}))
    assert collect.network_of_record(record) == "emulated 2 nodes, 50 Mbit/s links, 80 ms latency injected per wire step"
    old = make_run(tmp_path / "old", "fp4quant", split=False)  # written before the split: no rows
    assert len(collect.breakdown([old], "cpu", warmup=2)) == 0
    out = tmp_path / "breakdown.pdf"
    figures.breakdown(df, out, "cpu")
    assert out.read_bytes().startswith(b"%PDF") and read_stamp(out)["commit"] == ORIGIN["commit"]


def collectives_frame(iters=5) -> pd.DataFrame:
    rows = []
    for size in (4096, 65536, 1 << 20):
        for config, algorithm, lat in (("none", "uncompressed", 1e-3 + size / 5e6), ("fp4quant", "two_shot", 2e-3 + size / 3e7),
                                       ("fp4quant", "one_shot", 2e-3 + size / 2.5e7)):
            rows.append({**ORIGIN, "study": "presets", "config": config, "algorithm": algorithm, "chunk_policy": "none",
                         "size_bytes": size, "latency_s": lat, "latency_min_s": 0.9 * lat, "latency_max_s": 1.2 * lat,
                         "iters": iters, "world_size": 2, "backend": "gloo", "dtype": "bfloat16"})
    df = pd.DataFrame(rows)
    base = df[df.config == "none"].set_index("size_bytes").latency_s
    return df.assign(speedup=base.reindex(df.size_bytes).to_numpy() / df.latency_s.to_numpy())


def test_allreduce_band_and_emulated_panel(tmp_path):
    d = figures._allreduce_series(collectives_frame())
    two = d[(d.series == "fp4quant two_shot")]
    assert (two.speedup_low <= two.speedup).all() and (two.speedup <= two.speedup_high).all()
    assert two.speedup_low.to_numpy() == pytest.approx(two.speedup.to_numpy() / 1.2)
    out = tmp_path / "allreduce.pdf"
    figures.allreduce(collectives_frame(), out, "cpu", collectives_frame(), "emulated 2 nodes, 60 Mbit/s links")
    assert out.read_bytes().startswith(b"%PDF")
    legacy = collectives_frame().drop(columns=["latency_max_s"])  # benchmarks before the band: no band
    figures.allreduce(legacy, tmp_path / "loopback.pdf", "cpu")
    assert (tmp_path / "loopback.pdf").stat().st_size > 5000


def validation_frame(wait: bool = False) -> pd.DataFrame:
    """``wait``: runs from e18c9a2 on (communication the least over the ranks, the rest a wait)."""
    rows = []
    for config in ("bf16 @ 30 Mbit/s", "fp4quant @ 30 Mbit/s"):
        parts = [("compute", 0.1, 0.09), ("codec", 0.01 if "fp4" in config else 0.0, 0.012 if "fp4" in config else 0.0),
                 ("communication", 0.3, 0.33), ("total", 0.41, 0.432)]
        if wait:
            parts[2:3] = [("communication", 0.296, 0.33), ("wait", 0.004, 0.002)]
        for comp, m, p in parts:
            rows.append({**ORIGIN, "config": config, "comm": config.split()[0], "component": comp, "measured_s": m,
                         "measured_sd_s": 0.01, "predicted_s": p, "rel_error": p / m - 1 if m else "",
                         "probe": "probe.json", "latency_run": ""})
    return pd.DataFrame(rows)


def test_validation_figure_and_table(tmp_path):
    df = pd.read_csv(_csv(tmp_path, validation_frame()))
    figures.validation(df, tmp_path / "validation.pdf", "cpu")
    assert (tmp_path / "validation.pdf").read_bytes().startswith(b"%PDF")
    tables.model_validation(df, tmp_path / "t.tex", "cpu")
    tex = (tmp_path / "t.tex").read_text()
    assert r"fp4quant @ 30 Mbit/s & total & 410.00 $\pm$ 10.00 & 432.00 & +5\%" in tex
    assert r"bf16 @ 30 Mbit/s & codec & 0.00 $\pm$ 10.00 & 0.00 &  \\" in tex  # no error where nothing was measured
    assert "& wait &" not in tex and "a wait for a slower peer included" in tex  # older runs: no wait row


def test_validation_figure_and_table_with_the_wait(tmp_path):
    df = pd.read_csv(_csv(tmp_path, validation_frame(wait=True)))
    figures.validation(df, tmp_path / "validation.pdf", "cpu")
    assert (tmp_path / "validation.pdf").read_bytes().startswith(b"%PDF")
    tables.model_validation(df, tmp_path / "t.tex", "cpu")
    tex = (tmp_path / "t.tex").read_text()
    assert r"fp4quant @ 30 Mbit/s & wait & 4.00 $\pm$ 10.00 & 2.00 & -50\%" in tex
    assert "the least over the ranks" in tex


def _csv(tmp_path, df):
    path = tmp_path / "mv.csv"
    df.to_csv(path, index=False)
    return path


def test_repeated_validation_is_summarized_with_its_range(tmp_path):
    one = validation_frame()
    again = one.assign(measured_s=one.measured_s * 1.1, rel_error=[p / (m * 1.1) - 1 if m else "" for p, m in
                                                                   zip(one.predicted_s, one.measured_s)])
    df = pd.read_csv(_csv(tmp_path, pd.concat([one.assign(repeat=1), again.assign(repeat=2)])))
    s = model_validation.summary(df).set_index(["config", "component"])
    total = s.loc[("fp4quant @ 30 Mbit/s", "total")]
    assert total.repeats == 2 and total.measured_s == pytest.approx(0.41 * 1.05)
    assert total.measured_sd_s == pytest.approx(pd.Series([0.41, 0.451]).std())
    assert float(total.rel_error_min) == pytest.approx(0.432 / 0.451 - 1)
    assert float(total.rel_error_max) == pytest.approx(0.432 / 0.41 - 1)
    assert float(total.rel_error) == pytest.approx((0.432 / 0.451 + 0.432 / 0.41) / 2 - 1)
    tables.model_validation(df, tmp_path / "t.tex", "cpu")
    tex = (tmp_path / "t.tex").read_text()
    assert r"fp4quant @ 30 Mbit/s & total & 430.50 $\pm$ 28.99 & 432.00 & +1\% [-4\%, +5\%]" in tex
    assert "probed and run 2 times" in tex
    figures.validation(df, tmp_path / "validation.pdf", "cpu")
    assert (tmp_path / "validation.pdf").read_bytes().startswith(b"%PDF")
