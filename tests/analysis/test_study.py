"""The convergence study's statistics on synthetic run folders: per-run standard errors, the
paired difference to BF16 with its t interval, and the run names of one-direction compression."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fp4quant.analysis import study, tradeoff
from fp4quant.analysis.__main__ import main as analysis_main
from fp4quant.train.train_config import ConfigError, parse_run_name, run_name

PROV = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "abc123", "torch": "2.13.0+cpu"}


def write_run(folder, comm, seed, batches, compress="both", steps=40, **config):
    """A run folder as the trainer writes it, with the validation losses ``batches`` (``config``:
    the trainer's options that differ from the study's)."""
    folder.mkdir(parents=True)
    uncompressed = sent = 4_000_000
    cfg = {"model": "small", "comm": comm, "compress": compress, "compute": "exact", "seed": seed, "seq_len": 16,
           "batch_size": 2, "steps": steps, **config}
    summary = {"provenance": {**PROV, "config": cfg}, "mesh": {"tp": 2, "dp": 1, "world": 2, "backend": "gloo",
                                                                 "device": "cpu"},
               "steps": steps, "final_loss": float(np.mean(batches)) + 0.05, "val_loss": float(np.mean(batches)),
               "val_batch_losses": list(batches), "tokens_per_s": 100.0, "step_time_s": 0.3,
               "fwd_bytes_sent": sent / 2, "bwd_bytes_sent": sent / 2, "bytes_uncompressed": uncompressed}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "log.jsonl").write_text("".join(json.dumps({"step": i, "loss": 3.0 - i / steps, "lr": 1e-3,
                                                         "tokens_per_s": 100.0, "step_time_s": 0.3}) + "\n"
                                              for i in range(steps)))
    return folder


@pytest.fixture
def runs(tmp_path):
    """bf16 on seeds 0-3; fp4quant on seeds 0-2 (seed 3 has no pair); fp4quant@fwd on 0-2."""
    rng = np.random.default_rng(0)
    base = {s: 2.0 + 0.01 * s + rng.normal(0, 0.05, size=6) for s in range(4)}
    shift = {"fp4quant": [0.010, 0.025, 0.016], "fp4quant@fwd": [0.004, 0.001, 0.006]}
    dirs = [write_run(tmp_path / "bf16" / f"seed{s}", "bf16", s, base[s]) for s in range(4)]
    for name, deltas in shift.items():
        comm, compress, _ = parse_run_name(name)
        for s, delta in enumerate(deltas):
            dirs.append(write_run(tmp_path / name / f"seed{s}", comm, s, base[s] + delta, compress))
    return dirs, base, shift


def test_each_run_has_its_validation_standard_error(runs):
    dirs, base, _ = runs
    conv = study.runs(dirs, "study")
    row = conv[(conv.config == "bf16") & (conv.seed == 2)].iloc[0]
    assert row.val_se == pytest.approx(np.std(base[2], ddof=1) / math.sqrt(6))
    assert row.final_val_loss == pytest.approx(np.mean(base[2]))
    assert row.tokens == 40 * 16 * 2 and row.val_batches == 6
    assert row.wire_bits_per_value == pytest.approx(16.0)
    assert set(conv.config) == {"bf16", "fp4quant", "fp4quant@fwd"}
    assert conv[conv.config == "fp4quant"].wire_bits_per_value.iloc[0] == pytest.approx(4.515625)  # 4 + 8/16 + 32/2048
    assert conv[conv.config == "fp4quant@fwd"].wire_bits_per_value.iloc[0] == pytest.approx((4.515625 + 16) / 2)
    assert study.wire_bits_per_value("exact", "cpu") == 32 and study.wire_bits_per_value("exact", "cuda") == 16
    assert study.wire_bits_per_value("fp8", "cpu") == pytest.approx(8 + 32 / 2048)


def test_the_paired_difference_and_its_t_interval(runs):
    dirs, base, shift = runs
    table = study.summary(study.runs(dirs, "study"), ["bf16", "fp4quant", "fp4quant@fwd"]).set_index("config")
    assert list(table.index) == ["bf16", "fp4quant", "fp4quant@fwd"]
    for name, deltas in shift.items():
        r = table.loc[name]
        d = np.array(deltas)  # the seeds both have: 0-2 (bf16's seed 3 is unpaired)
        assert r.n == 3 and r.n_pairs == 3
        assert r.diff_mean == pytest.approx(d.mean()) and r.diff_sd == pytest.approx(d.std(ddof=1))
        half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
        assert (r.ci_low, r.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)  # scipy's own interval agrees
        assert (r.ci_low, r.ci_high) == pytest.approx((ci.low, ci.high))
        # the same tokens: each batch shifted by the same amount, so the validation set adds no noise
        assert r.diff_batch_se == pytest.approx(0.0, abs=1e-12)
        assert r.val_se_le_quarter_gap  # a gap the same batches shifted alike: resolved
    assert table.loc["bf16"].n == 4 and not math.isnan(table.loc["bf16"].val_loss_sd)


def test_the_validation_set_resolves_a_gap_when_the_paired_se_is_a_quarter_of_it(tmp_path):
    rng = np.random.default_rng(1)
    base = {s: 2.0 + rng.normal(0, 0.05, size=6) for s in range(3)}
    noise = {s: rng.normal(0, 0.05, size=6) for s in range(3)}  # per batch: paired SE ~0.02
    dirs = [write_run(tmp_path / "bf16" / f"seed{s}", "bf16", s, base[s]) for s in range(3)]
    for comm, shift in (("nvfp4", 0.004), ("mxfp4", 0.3)):
        dirs += [write_run(tmp_path / comm / f"seed{s}", comm, s, base[s] + shift + noise[s]) for s in range(3)]
    table = study.summary(study.runs(dirs, "study")).set_index("config")
    for comm in ("nvfp4", "mxfp4"):
        r = table.loc[comm]
        se = np.mean([np.std(noise[s], ddof=1) / math.sqrt(6) for s in range(3)])
        assert r.diff_batch_se == pytest.approx(se)
        assert r.val_se_le_quarter_gap == (comm == "mxfp4")


def test_a_hand_computed_interval():
    r = study.paired_difference(pd.Series([2.1, 2.2, 2.3]), pd.Series([2.0, 2.0, 2.0]))
    assert r["n_pairs"] == 3 and r["diff_mean"] == pytest.approx(0.2) and r["diff_sd"] == pytest.approx(0.1)
    assert r["ci_high"] - 0.2 == pytest.approx(4.302652729911275 * 0.1 / math.sqrt(3))  # t(0.975, 2 df)
    one = study.paired_difference(pd.Series([2.1]), pd.Series([2.0]))
    assert one["diff_mean"] == pytest.approx(0.1) and math.isnan(one["ci_low"]) and math.isnan(one["diff_sd"])


def test_the_projection_is_the_step_models():
    assert study.projected_speedup("bf16") == pytest.approx(1.0)
    assert study.projected_speedup("exact") == pytest.approx(1.0)  # the tensors' own dtype there: BF16
    full, fwd = study.projected_speedup("fp4quant"), study.projected_speedup("fp4quant@fwd")
    assert full > fwd > 1.0


def test_the_cli_writes_results_with_provenance(runs, tmp_path, capsys):
    dirs, _, _ = runs
    out, tables = tmp_path / "results", tmp_path / "results" / "convergence_runs"
    assert analysis_main(["study", "--profile", "study", "--runs", *map(str, dirs), "--order", "bf16", "fp4quant",
                          "--out-dir", str(out), "--tables-dir", str(tables)]) == 0
    conv = pd.read_csv(out / "convergence.csv")
    assert {"config", "seed", "steps", "tokens", "final_val_loss", "hardware", "commit", "torch"} <= set(conv)
    summary = pd.read_csv(out / "convergence_summary.csv")
    assert list(summary.config) == ["bf16", "fp4quant", "fp4quant@fwd"] and set(summary.commit) == {"abc123"}
    md = (out / "convergence_summary.md").read_text()
    assert md.startswith("<!-- provenance: AMD EPYC, 2 cores (CPU), commit abc123") and "| fp4quant@fwd | 3 |" in md
    assert (tables / "training.csv").exists() and (tables / "curves.csv").exists()
    for name in ("convergence", "tradeoff"):
        results = tables if name == "convergence" else out
        assert analysis_main(["figure", name, "--results", str(results), "--profile", "study",
                              "--out", str(tmp_path / f"{name}.pdf")]) == 0
        assert (tmp_path / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    # the trade-off beside the SQNR on captured traffic: of the same origin, else refused
    traffic = tmp_path / "traffic_summary.csv"
    rows = [{"direction": d, "study": study_, "method": m, "rotation": rot, "scale_select": sel,
             "sqnr_pooled_db": 20.0 + i, "model": "small", "capture_steps": "1 200 399", **PROV}
            for i, (d, study_, m, rot, sel) in enumerate([("fwd", "presets", "fp4quant", "group", "max_to_6"),
                                                          ("bwd", "presets", "nvfp4", "none", "max_to_6"),
                                                          ("fwd", "rotation", "no_fwht", "group", "4_over_6")])]
    pd.DataFrame(rows).to_csv(traffic, index=False)
    t = tradeoff.traffic_sqnr(pd.read_csv(traffic))
    assert list(t.label) == ["fp4quant", "nvfp4", "fp4quant + 4 over 6"]
    assert t.bits.tolist() == pytest.approx([4.515625, 4.5, 4.515625])
    args = ["figure", "tradeoff", "--results", str(out), "--profile", "study", "--out", str(tmp_path / "t.pdf"),
            "--traffic", str(traffic)]
    assert analysis_main(args) == 0 and (tmp_path / "t.pdf").read_bytes().startswith(b"%PDF")
    pd.DataFrame(rows).assign(commit="def456").to_csv(traffic, index=False)
    assert analysis_main(args) == 2 and "mixed results" in capsys.readouterr().err


def test_runs_without_validation_batches_are_refused(tmp_path, capsys):
    d = write_run(tmp_path / "bf16" / "seed0", "bf16", 0, [2.0, 2.1])
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**s, "val_batch_losses": None}))
    assert analysis_main(["study", "--profile", "study", "--runs", str(d), "--out-dir", str(tmp_path / "o"),
                          "--tables-dir", str(tmp_path / "t")]) == 2
    assert "no validation loss per batch" in capsys.readouterr().err
    (d / "summary.json").write_text(json.dumps({**s, "val_batch_losses": [2.0, float("nan")]}))
    with pytest.raises(study.StudyError, match="not finite"):
        study.runs([d], "study")


def test_run_names_round_trip_and_refuse_what_changes_nothing():
    for name in ("fp4quant", "fp4quant@fwd", "no_fwht@bwd", "fp4quant+quartet", "fp4quant@bwd+quartet", "exact", "bf16"):
        assert run_name(*parse_run_name(name)) == name
    assert parse_run_name("fp4quant@fwd") == ("fp4quant", "fwd", "exact")
    for bad, words in (("bf16@fwd", "changes nothing"), ("exact@bwd", "changes nothing"),
                       ("fp4quant@both", "changes nothing"), ("fp4quant@up", "must name a direction"),
                       ("fp8x", "not a TP communication preset"), ("fp4quant+fast", "must be a compute")):
        with pytest.raises(ConfigError, match=words):
            parse_run_name(bad)


def edit_summary(folder, **changes):
    """Change a run's summary.json: top-level entries, or its configuration's (``config={...}``)."""
    s = json.loads((folder / "summary.json").read_text())
    s["provenance"]["config"].update(changes.pop("config", {}))
    s.update(changes)
    (folder / "summary.json").write_text(json.dumps(s))


def study_cli(dirs, tmp_path):
    return analysis_main(["study", "--profile", "study", "--runs", *map(str, dirs), "--out-dir", str(tmp_path / "o"),
                          "--tables-dir", str(tmp_path / "t")])


def test_runs_that_do_not_belong_together_are_refused_in_one_line(tmp_path, capsys):
    # a short BF16 run of a transformers model beside a longer fp4quant run of the preset: no paired gap
    base = [2.0, 2.1, 2.2]
    dirs = [write_run(tmp_path / "bf16/seed0", "bf16", 0, base, steps=30, model="hf:/models/qwen/config.json"),
            write_run(tmp_path / "fp4quant/seed0", "fp4quant", 0, [x - 0.12 for x in base], steps=60, model="tiny")]
    assert study_cli(dirs, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"runs differ in model: hf:/models/qwen/config.json (run {dirs[0]}) vs tiny (run {dirs[1]})" in err
    assert "also differ in steps" in err and "may differ only in comm, compress, compute, seed" in err
    assert not (tmp_path / "o").exists()  # nothing written


@pytest.mark.parametrize("field, change", [
    ("steps", {"steps": 80}),  # trained longer: the summary's steps
    ("seq_len", {"config": {"seq_len": 32}}), ("batch_size", {"config": {"batch_size": 4}}),
    ("lr", {"config": {"lr": 1e-2}}), ("eval_batches", {"config": {"eval_batches": 4}}),
    ("algorithm", {"config": {"algorithm": "ring"}}),
    ("stochastic_backward", {"config": {"stochastic_backward": False}}),
    ("data", {"config": {"data": "data/other/tokens"}}),
    ("mesh.tp", {"mesh": {"tp": 4, "dp": 1, "world": 4, "backend": "gloo", "device": "cpu"}}),
    ("mesh.dp", {"mesh": {"tp": 2, "dp": 2, "world": 4, "backend": "gloo", "device": "cpu"}}),
    ("mesh.device", {"mesh": {"tp": 2, "dp": 1, "world": 2, "backend": "nccl", "device": "cuda"}}),
    ("architecture.hidden_size", {"model": {"hidden_size": 512}}),
    ("lr_schedule", {"lr_schedule": [{"from_step": 0, "steps": 20}, {"from_step": 20, "steps": 40}]}),  # extended
])
def test_each_field_that_makes_runs_incomparable_is_named(runs, tmp_path, capsys, field, change):
    dirs, _, _ = runs
    for d in dirs:  # what the trainer records of every run
        edit_summary(d, model={"hidden_size": 256}, lr_schedule=[{"from_step": 0, "steps": 40}])
    edit_summary(dirs[-1], **change)
    assert study_cli(dirs, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"runs differ in {field}: " in err and f"(run {dirs[-1]})" in err
    assert f"(runs {dirs[0]}, {dirs[1]}, {dirs[2]} and {len(dirs) - 4} more)" in err  # the rest, counted


def test_what_a_study_varies_and_bookkeeping_may_differ(runs, tmp_path):
    dirs, _, _ = runs  # comm, compress and seed already differ
    edit_summary(dirs[0], config={"out": "elsewhere", "checkpoint_every": 7, "keep_checkpoints": 1, "device": "auto",
                                  "validate_every_step": True, "sync_timing": True, "capture_traffic_steps": "1"})
    edit_summary(dirs[1], config={"compute": "quartet"})
    assert study_cli(dirs, tmp_path) == 0


def test_the_data_is_compared_by_its_checksum_where_every_run_records_one(runs, tmp_path, capsys):
    dirs, _, _ = runs
    for i, d in enumerate(dirs):  # the same tokens, prepared in two folders
        edit_summary(d, data_sha256="a" * 64, config={"data": f"data/copy{i % 2}/tokens"})
    assert study_cli(dirs, tmp_path) == 0
    edit_summary(dirs[-1], data_sha256="b" * 64)
    assert study_cli(dirs, tmp_path) == 2
    assert "runs differ in data_sha256: " + "a" * 64 in capsys.readouterr().err


def test_an_incomplete_run_is_refused(runs, tmp_path, capsys):
    dirs, _, _ = runs
    (dirs[1] / "log.jsonl").unlink()
    assert study_cli(dirs, tmp_path) == 2
    assert f"{dirs[1]}: log.jsonl missing: the training run is not complete" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything is written
    (dirs[1] / "summary.json").unlink()
    assert study_cli(dirs, tmp_path) == 2
    assert f"{dirs[1]}: summary.json and log.jsonl missing" in capsys.readouterr().err


def test_the_throughput_step_refuses_runs_that_do_not_belong_together(tmp_path, capsys):
    dirs = [write_run(tmp_path / f"{c}/seed0", c, 0, [2.0, 2.1], seq_len=s)
            for c, s in (("bf16", 16), ("fp4quant", 64))]
    assert analysis_main(["throughput", "--profile", "cpu", "--runs", *map(str, dirs), "--warmup", "1",
                          "--out", str(tmp_path / "throughput.csv")]) == 2
    assert "runs differ in seq_len: 16 (run" in capsys.readouterr().err and not (tmp_path / "throughput.csv").exists()
