"""The TP-degree study's statistics on synthetic run folders: the two one-sided tests against a
margin, the verdicts, the controls, the headline sentence, the CLI's tables and figures."""

from __future__ import annotations

import json
import re
import shutil
import tarfile

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fp4quant.analysis import study, study_tp
from fp4quant.analysis.__main__ import main as analysis_main

from test_study import PROV, write_run


CODE = "c0de" * 4  # the training code's digest every synthetic run records


def tp_run(root, tp, comm, seed, batches, **config):
    folder = write_run(root / f"tp{tp}" / comm / f"seed{seed}", comm.removesuffix("-alone"), seed, batches, tp=tp,
                       **({"rounding_alone": True} if comm.endswith("-alone") else {}), **config)
    summary = json.loads((folder / "summary.json").read_text())
    summary["mesh"].update(tp=tp, world=tp, backend="simulated" if tp > 1 else None)
    summary["comm"] = {"label": comm if tp > 1 or comm.endswith("-alone") else "exact"}
    summary["provenance"]["code"] = CODE
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture
def runs(tmp_path):
    """bf16 and fp4quant at TP 2 and 16, 5 seeds; fp4quant +0.01 at TP 2 (within +-0.05), +0.2 at
    TP 16 (outside); the controls exact at TP 2, exact and bf16-alone at TP 1."""
    rng = np.random.default_rng(1)
    dirs = []
    for tp, gap in ((2, 0.01), (16, 0.2)):
        for s in range(5):
            base = 2.0 + 0.02 * s + rng.normal(0, 0.03, size=8)
            dirs.append(tp_run(tmp_path, tp, "bf16", s, base))
            dirs.append(tp_run(tmp_path, tp, "fp4quant", s, base + gap + rng.normal(0, 0.002)))
            if tp == 2:
                dirs.append(tp_run(tmp_path, 2, "exact", s, base + 0.04 + rng.normal(0, 0.002)))
                dirs.append(tp_run(tmp_path, 1, "exact", s, base + 0.03))
                dirs.append(tp_run(tmp_path, 1, "bf16-alone", s, base + rng.normal(0, 0.002)))
    return dirs


def test_tost_against_scipy():
    d = np.array([0.01, 0.02, -0.005, 0.015, 0.0])
    r = study_tp.tost(d, 0.05)
    se = d.std(ddof=1) / np.sqrt(5)
    assert r["p_upper"] == pytest.approx(stats.ttest_1samp(d, 0.05, alternative="less").pvalue)
    assert r["p_lower"] == pytest.approx(stats.ttest_1samp(d, -0.05, alternative="greater").pvalue)
    assert r["ci90_high"] == pytest.approx(d.mean() + stats.t.ppf(0.95, 4) * se)


@pytest.mark.parametrize("d, word", [([0.01, 0.012, 0.008, 0.011, 0.009], "within the margin"),
                                     ([0.2, 0.21, 0.19, 0.2, 0.205], "outside the margin (worse)"),
                                     ([-0.2, -0.21, -0.19, -0.2, -0.205], "outside the margin (better)"),
                                     ([0.0, 0.1, -0.05, 0.08, 0.02], "not resolved, by"),
                                     ([0.01], "not resolved: fewer than two")])
def test_verdicts(d, word):
    d = np.array(d)
    row = {"n_pairs": len(d), **study.paired_difference(pd.Series(d), pd.Series(np.zeros(len(d)))),
           **study_tp.tost(d, 0.05)}
    assert study_tp.verdict(row, 0.05).startswith(word)


def test_the_summary_compares_with_bf16_at_each_tp(runs):
    conv = study.runs(runs, "study_tp")
    table = study_tp.summary(conv, 0.05, ["bf16", "fp4quant"])
    fp = table[table.config == "fp4quant"].set_index("tp")
    assert fp.loc[2, "verdict"] == "within the margin" and fp.loc[16, "verdict"] == "outside the margin (worse)"
    assert fp.loc[16, "n_pairs"] == 5 and fp.loc[16, "diff_mean"] == pytest.approx(0.2, abs=0.005)
    assert set(table.ranks) == {"simulated", "one process"}
    assert study_tp.headline(table).startswith("fp4quant at TP = 16: +0.20")
    controls = {(r["tp"], r["config"]): r for r in study_tp.controls(conv, 0.05)}
    assert controls[(2, "exact")]["diff_mean"] == pytest.approx(0.04, abs=0.005)
    assert controls[(1, "bf16-alone")]["baseline"] == "exact"
    assert controls[(1, "bf16-alone")]["diff_mean"] == pytest.approx(-0.03, abs=0.005)


def test_the_gap_s_trend_against_tp_is_each_seed_s_slope_averaged_over_seeds(runs):
    """The gap grows by 0.19 nats over three doublings of TP in the fixture: each seed's slope
    against log2 TP as scipy fits it, their t interval over the seeds, and the sentence says the
    interval lies above 0; a study of one degree, or of one seed, has no trend."""
    conv = study.runs(runs, "study_tp")
    t = study_tp.trend(conv)
    slopes = []
    for s in range(5):
        g = conv[conv.seed == s].pivot_table(index="tp", columns="config", values="final_val_loss").loc[[2, 16]]
        slopes.append(stats.linregress(np.log2(g.index), g.fp4quant - g.bf16).slope)
    low, high = stats.t.interval(0.95, 4, loc=np.mean(slopes), scale=stats.sem(slopes))
    assert t["slope"] == pytest.approx(0.19 / 3, abs=0.002) and t["n_seeds"] == 5 and t["tps"] == [2, 16]
    assert (t["slope"], t["ci_low"], t["ci_high"]) == pytest.approx((np.mean(slopes), low, high))
    table = study_tp.summary(conv, 0.05, ["bf16", "fp4quant"])
    text = study_tp.markdown(table, conv, study_tp.controls(conv, 0.05))
    assert "per doubling of TP" in text and "over TP = 2, 16): the interval lies above 0." in text, text
    assert study_tp.trend(conv[conv.tp != 16]) is None and study_tp.trend(conv[conv.seed == 0]) is None
    assert "doubling" not in study_tp.markdown(study_tp.summary(conv[conv.tp != 16], 0.05), conv[conv.tp != 16], [])


def test_a_margin_that_is_not_positive_is_refused(runs):
    with pytest.raises(study.StudyError, match="margin"):
        study_tp.summary(study.runs(runs, "p"), 0.0)


def test_the_cli_writes_tables_and_the_figures(runs, tmp_path, capsys):
    out, fig = tmp_path / "results", tmp_path / "loss_gap_tp.pdf"
    assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--order", "bf16",
                          "fp4quant", "--margin", "0.05", "--out-dir", str(out), "--figure", str(fig)]) == 0
    md = (out / "tp_summary.md").read_text()
    assert md.startswith("<!-- provenance: AMD EPYC") and "**fp4quant at TP = 16" in md and "bf16-alone - exact" in md
    assert "Each pair's two runs trained on one CPU model." in md
    assert fig.read_bytes().startswith(b"%PDF")
    assert set(pd.read_csv(out / "tp_summary.csv").tp) == {1, 2, 16}
    summary = tmp_path / "reduced_error_summary.csv"
    pd.DataFrame([{"tp": tp, "direction": d, "preset": p, "tensors": 3, "sqnr_db_median": 20 - tp / 4,
                   "sqnr_db_min": 19 - tp / 4, "sqnr_db_max": 21 - tp / 4, "sqnr_db_pooled": 20.0,
                   "single_sqnr_db_median": 20.0, "single_sqnr_db_min": 19.0, "single_sqnr_db_max": 21.0, **PROV,
                   # each degree measured in the sitting that trained its capture: commits and CPUs differ
                   **({"commit": "def456", "hardware": "Intel(R) Xeon(R) Processor, 2 cores (CPU)"} if tp == 2 else {})}
                  for tp in (2, 16) for d in ("fwd", "bwd") for p in ("bf16", "fp4quant")]).to_csv(summary, index=False)
    assert analysis_main(["study-tp-sqnr", "--profile", "study_tp", "--summary", str(summary),
                          "--out", str(tmp_path / "sqnr.pdf")]) == 0
    assert (tmp_path / "sqnr.pdf").read_bytes().startswith(b"%PDF")
    frame = pd.read_csv(summary)
    frame.loc[frame.tp == 2, "torch"] = "2.12.0+cpu"  # but one torch
    frame.to_csv(summary, index=False)
    capsys.readouterr()
    assert analysis_main(["study-tp-sqnr", "--profile", "study_tp", "--summary", str(summary),
                          "--out", str(tmp_path / "sqnr2.pdf")]) == 2
    assert "2.12.0+cpu" in capsys.readouterr().err


def test_runs_of_another_model_are_refused_in_one_line(runs, tmp_path, capsys):
    other = tp_run(tmp_path / "other", 2, "bf16", 9, [2.0, 2.1], model="tiny")
    code = analysis_main(["study-tp", "--profile", "p", "--runs", *map(str, runs), str(other), "--margin", "0.05",
                          "--out-dir", str(tmp_path / "r"), "--figure", str(tmp_path / "f.pdf")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("fp4quant.analysis: error: runs differ in model")


def test_runs_of_several_commits_and_machines_but_one_training_code_are_one_study(runs, tmp_path, capsys):
    """The study's runs gather over sittings: other commits and CPUs are named, not refused; a run
    of other training code (or a part of one, resumed under it) is refused in one line."""
    def edit(folder, **prov):
        summary = json.loads((folder / "summary.json").read_text())
        summary["provenance"].update(prov)
        summary["segments"] = [{"from_step": 0, "provenance": {k: v for k, v in summary["provenance"].items()
                                                               if k != "config"}}]
        (folder / "summary.json").write_text(json.dumps(summary))
        return summary

    edit(runs[0], commit="b" * 40, hardware="Intel(R) Xeon(R) Processor, 2 cores (CPU)")
    args = ["study-tp", "--profile", "p", "--runs", *map(str, runs), "--margin", "0.05", "--order", "bf16", "fp4quant",
            "--out-dir", str(tmp_path / "r"), "--figure", str(tmp_path / "f.pdf")]
    assert analysis_main(args) == 0
    head = (tmp_path / "r" / "tp_summary.md").read_text().splitlines()[0]
    assert "Intel(R) Xeon" in head and "AMD EPYC" in head and f"training code {CODE}" in head and "bbbbbbbbbbbb" in head
    # runs[0] is TP 2's bf16 of seed 0: its pairs with fp4quant and with float32 span two CPU models
    md = (tmp_path / "r" / "tp_summary.md").read_text()
    assert "different CPU models: TP 2 fp4quant seed(s) 0; TP 2 exact seed(s) 0." in md, md
    assert pd.read_csv(tmp_path / "r" / "tp_summary.csv").set_index(["tp", "config"]).pairs_across_cpus[2, "fp4quant"] in (0, "0")
    summary = edit(runs[3])
    summary["segments"].append({"from_step": 100, "provenance": {**summary["segments"][0]["provenance"], "code": "other"}})
    (runs[3] / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert analysis_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mixed runs" in err[0] and str(runs[3]) in err[0] and "other" in err[0], err


def test_an_unknown_digest_or_another_torch_is_refused_by_name(runs):
    """A run recorded outside git ("unknown") names no training code: it is not one study with
    the rest; a run of another torch is refused as such, not as other training code."""
    from fp4quant.analysis.origin import MixedOrigin, check_same_training_code

    def edit(folder, **prov):
        summary = json.loads((folder / "summary.json").read_text())
        summary["provenance"].update(prov)
        (folder / "summary.json").write_text(json.dumps(summary))

    edit(runs[1], torch="2.12.0+cpu")
    with pytest.raises(MixedOrigin, match=r"ran torch 2\.13\.0\+cpu but .* 2\.12\.0\+cpu; retrain the study's runs at "
                                          r"one torch "):
        check_same_training_code(runs)
    edit(runs[1], torch="2.13.0+cpu", code="unknown")
    with pytest.raises(MixedOrigin, match="records no training-code digest"):
        check_same_training_code(runs)


def test_one_seed_so_far_prints_no_nan_and_no_empty_interval(tmp_path, capsys):
    """A study read while it runs (one paired seed): the sentence and the table say so."""
    runs = [tp_run(tmp_path, 16, "bf16", 0, [2.0, 2.1, 2.05]), tp_run(tmp_path, 16, "fp4quant", 0, [2.02, 2.12, 2.07])]
    assert analysis_main(["study-tp", "--profile", "p", "--runs", *map(str, runs), "--margin", "0.05", "--order", "bf16",
                          "fp4quant", "--out-dir", str(tmp_path / "r"), "--figure", str(tmp_path / "f.pdf")]) == 0
    md = (tmp_path / "r" / "tp_summary.md").read_text()
    assert "one seed: no interval" in md and "not resolved: fewer than two paired seeds" in md
    assert not re.search(r"\bnan\b", md, re.I) and "[, ]" not in md and "1.0 seeds" not in md


def test_the_cost_counts_a_paused_step_as_a_typical_one(runs, tmp_path):
    """A run stopped for half an hour in one step (a CI proof beside the study) costs its median
    step times its steps; the CLI states the study's core-hours, in all and by TP."""
    log = runs[0] / "log.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    rows[7]["step_time_s"] = 1800.0
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert study_tp.run_hours(runs[0]) == pytest.approx(0.3 * len(rows) / 3600)
    out = tmp_path / "results"
    assert analysis_main(["study-tp", "--profile", "p", "--runs", *map(str, runs), "--margin", "0.05", "--order",
                          "bf16", "fp4quant", "--out-dir", str(out), "--figure", str(tmp_path / "f.pdf"),
                          "--cores-per-run", "60"]) == 0
    # 60 cores a run, 40 steps of 0.3 s: 0.2 core-hours a run; TP 16 and 1 ran 10 runs, TP 2 15
    line = (out / "tp_summary.md").read_text().splitlines()[-1]
    assert line.startswith(f"Cost: {len(runs)} of {len(runs)} runs timed, 7.0 core-hours"), line
    assert line.endswith("by TP: 16: 2.0, 2: 3.0, 1: 2.0."), line
    assert pd.read_csv(out / "tp_convergence.csv").hours.notna().all()


def test_runs_without_a_step_log_are_not_costed_as_zero(runs):
    """Missing logs are counted as missing, never as 0 hours; a degree with none prints "--"."""
    for r in runs:
        if "tp16" in str(r):
            (r / "log.jsonl").unlink()
    conv = study.runs(runs, "p")
    conv = conv.assign(hours=[study_tp.run_hours(r) for r in conv.run])
    line = study_tp.cost(conv, None)
    assert line.startswith(f"Cost: {len(runs) - 10} of {len(runs)} runs timed") and "16: --" in line, line
    assert "hours of one process each" in line


def test_controls_print_no_nan_and_no_empty_interval_mid_study(runs, tmp_path):
    """One seed of a control pairs: its difference without an interval; none pairs: an empty row."""
    keep = [r for r in runs if not (("exact" in str(r) or "alone" in str(r)) and not str(r).endswith("seed0"))]
    keep = [r for r in keep if not ("tp1" in str(r) and "exact" in str(r))]  # bf16-alone pairs with no float32 run
    conv = study.runs(keep, "p")
    md = study_tp.markdown(study_tp.summary(conv, 0.05), conv, study_tp.controls(conv, 0.05))
    assert not re.search(r"\bnan\b", md) and "[, ]" not in md, md
    rows = {line.split("|")[2].strip(): line for line in md.splitlines() if " - " in line and line.startswith("| ")}
    assert rows["exact - bf16"].split("|")[3].strip() == "1" and "[" not in rows["exact - bf16"].split("|")[4]


def test_a_study_of_several_commits_freezes_with_its_training_code(tmp_path, capsys):
    """freeze --study: a study's runs span commits and machines of one training code; its README
    names them all and the code; a run of other training code is refused in one line."""
    src = tmp_path / "data" / "study_tp"
    runs = [tp_run(src / "tp_runs", 16, c, s, [2.0 + 0.01 * s, 2.1, 2.05]) for c in ("bf16", "fp4quant") for s in (0, 1)]
    summary = json.loads((runs[1] / "summary.json").read_text())
    summary["provenance"].update(commit="b" * 40, hardware="Intel(R) Xeon(R) Processor, 2 cores (CPU)")
    (runs[1] / "summary.json").write_text(json.dumps(summary))
    assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--margin", "0.05",
                          "--order", "bf16", "fp4quant", "--out-dir", str(src / "results"),
                          "--figure", str(src / "figures" / "loss_gap_tp.pdf")]) == 0
    ref = tmp_path / "reference"
    args = ["freeze", "--profile", "study_tp", "--data", str(tmp_path / "data"), "--study", "--produced-by",
            "snakemake study_tp"]
    assert analysis_main([*args, "--to", str(ref / "a")]) == 0
    readme = (ref / "a" / "README.md").read_text()
    assert f"- training code: {CODE}" in readme and "b" * 40 in readme and "Intel(R) Xeon" in readme, readme
    assert (ref / "a" / "data/study_tp/figures/loss_gap_tp.pdf").exists()
    assert (ref / "a" / "data/study_tp/tp_runs/tp16/bf16/seed0/summary.json").exists()
    assert (ref / "a" / "raw.tar.xz").exists() and not list((ref / "a").rglob("log.jsonl"))
    capsys.readouterr()  # without --study: a workflow run's figures are asked for, made at one commit
    assert analysis_main(["freeze", "--profile", "study_tp", "--data", str(tmp_path / "data"), "--to",
                          str(ref / "b"), "--figures", str(src / "figures"), "--tables", str(src)]) == 2
    assert "is missing: the run is not complete" in capsys.readouterr().err
    summary["provenance"]["code"] = "other"
    (runs[1] / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert analysis_main([*args, "--to", str(ref / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mixed runs" in err[0] and "training code" in err[0], err


def build_results(src, runs):
    """The study's results over ``runs`` (run folders under ``src``, the profile's folder)."""
    assert analysis_main(["study-tp", "--profile", "study_tp", "--runs", *map(str, runs), "--margin", "0.05",
                          "--order", "bf16", "fp4quant", "--out-dir", str(src / "results"),
                          "--figure", str(src / "figures" / "loss_gap_tp.pdf")]) == 0


def freeze_study(tmp_path, capsys, to, *flags):
    """freeze --study of tmp_path/data/study_tp into tmp_path/to: its exit code and error lines."""
    capsys.readouterr()
    rc = analysis_main(["freeze", "--profile", "study_tp", "--data", str(tmp_path / "data"), "--study", *flags,
                        "--produced-by", "snakemake study_tp", "--to", str(tmp_path / to)])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_freeze_refuses_study_results_older_than_its_runs(tmp_path, capsys):
    """freeze --study: results built before a run was added, or before one was retrained, are
    stale; each refused in one line naming the run, and the TP degrees they span are allowed."""
    src = tmp_path / "data" / "study_tp"
    runs = [tp_run(src / "tp_runs", tp, c, s, [2.0 + 0.01 * s, 2.1, 2.05])
            for tp in (2, 16) for c in ("bf16", "fp4quant") for s in (0, 1)]

    def results(of):
        build_results(src, of)

    def freeze(to):
        return freeze_study(tmp_path, capsys, to)

    results(runs[:-1])  # before the last run was trained
    rc, err = freeze("a")
    assert rc == 2 and len(err) == 1 and "tp16/fp4quant/seed1" in err[0] and "no table" in err[0], err
    results(runs)
    summary = json.loads((runs[0] / "summary.json").read_text())
    summary["val_loss"] += 0.01  # retrained after the results were built
    (runs[0] / "summary.json").write_text(json.dumps(summary))
    rc, err = freeze("b")
    assert rc == 2 and len(err) == 1 and "tp2/bf16/seed0" in err[0] and "retrained" in err[0], err
    results(runs)
    rc, err = freeze("c")
    assert rc == 0, err


def test_a_partial_freeze_keeps_the_named_runs_and_leaves_the_rest(tmp_path, capsys):
    """freeze --study --partial: the batches the results cover frozen while the others gather; the runs
    its results name go in, a finished run of another batch is carried apart (with its job's log),
    an unfinished run (and its job's log) stays behind, and the README says so.  Without --partial
    the same folder is refused."""
    src = tmp_path / "data" / "study_tp"
    named = [tp_run(src / "tp_runs", 16, c, s, [2.0 + 0.01 * s, 2.1, 2.05])
             for c in ("bf16", "fp4quant") for s in (0, 1)]
    later = tp_run(src / "tp_runs", 2, "bf16", 0, [2.0, 2.1, 2.05])  # finished, of a batch the results do not cover
    # finished too, but its captured traffic not yet measured: carried without it, it never could be
    (tp_run(src / "tp_runs", 4, "bf16", 0, [2.0, 2.1, 2.05]) / "traffic").mkdir()
    unfinished = src / "tp_runs" / "tp8" / "bf16" / "seed0"
    (unfinished / "checkpoints").mkdir(parents=True)
    (unfinished / "log.jsonl").write_text(json.dumps({"step": 0, "loss": 2.3}) + "\n")
    (src / "logs").mkdir()
    for run in ("tp16_bf16_seed0", "tp8_bf16_seed0", "tp2_bf16_seed0"):
        (src / "logs" / f"tp_train_{run}.log").write_text("trained\n")
    build_results(src, named)

    def freeze(to, *flags):
        return freeze_study(tmp_path, capsys, to, *flags)

    rc, err = freeze("whole")
    assert rc == 2 and len(err) == 1 and "tp8/bf16/seed0" in err[0], err  # unfinished
    shutil.move(unfinished, tmp_path / "aside")
    rc, err = freeze("whole-finished")
    assert rc == 2 and len(err) == 1 and "tp2/bf16/seed0" in err[0] and "no table" in err[0], err
    shutil.move(tmp_path / "aside", unfinished)
    capsys.readouterr()
    assert analysis_main(["freeze", "--profile", "study_tp", "--data", str(tmp_path / "data"), "--partial",
                          "--to", str(tmp_path / "not-a-study")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--study" in err[0], err
    assert freeze("first", "--partial")[0] == 0
    ref = tmp_path / "first"
    kept = sorted(p.relative_to(ref / "data/study_tp/tp_runs").parent.as_posix()
                  for p in (ref / "data/study_tp/tp_runs").rglob("summary.json"))
    assert kept == ["tp16/bf16/seed0", "tp16/bf16/seed1", "tp16/fp4quant/seed0", "tp16/fp4quant/seed1"], kept
    assert not (ref / "data/study_tp/tp_runs/tp8").exists() and not (ref / "data/study_tp/tp_runs/tp2").exists()
    with tarfile.open(ref / "raw.tar.xz") as tar:
        names = tar.getnames()
    assert "data/study_tp/logs/tp_train_tp16_bf16_seed0.log" in names, names
    assert not [n for n in names if "tp8" in n or "tp2" in n], names
    with tarfile.open(ref / "carried.tar.xz") as tar:
        carried = sorted(tar.getnames())
    assert carried == ["data/study_tp/logs/tp_train_tp2_bf16_seed0.log",
                       "data/study_tp/tp_runs/tp2/bf16/seed0/log.jsonl",
                       "data/study_tp/tp_runs/tp2/bf16/seed0/summary.json"], carried
    readme = (ref / "README.md").read_text()
    assert ("- partial: the 4 runs the study's results name (the batches they cover); 1 finished run of another batch is "
            "carried in `carried.tar.xz`") in readme, readme
    assert ("; 2 unfinished under data/study_tp (or with captured traffic not yet measured) were left behind"
            in readme), readme
    assert "--study --partial" in readme
    summary = json.loads((named[0] / "summary.json").read_text())
    summary["val_loss"] += 0.01  # a named run retrained after the results: still stale when partial
    (named[0] / "summary.json").write_text(json.dumps(summary))
    rc, err = freeze("stale", "--partial")
    assert rc == 2 and len(err) == 1 and "retrained" in err[0], err


def test_a_partial_freeze_refuses_what_would_leave_it_stale(tmp_path, capsys):
    """freeze --study --partial leaves behind only runs the results could not have named: a
    finished run beside the runs they name is newer than them, a benchmark built from a run left
    behind mixes batches, and results naming no run freeze nothing; each refused in one line."""
    src = tmp_path / "data" / "study_tp"
    named = [tp_run(src / "tp_runs", 16, c, s, [2.0 + 0.01 * s, 2.1, 2.05])
             for c in ("bf16", "fp4quant") for s in (0, 1)]
    later = tp_run(src / "tp_runs", 2, "bf16", 0, [2.0, 2.1, 2.05])

    def results(of):
        build_results(src, of)

    def freeze(to):
        return freeze_study(tmp_path, capsys, to, "--partial")

    results(named[1:])  # built before tp16/bf16/seed0 finished
    rc, err = freeze("a")
    assert rc == 2 and len(err) == 1 and "tp16/bf16/seed0" in err[0] and "older than it" in err[0], err
    results(named)
    bench = src / "bench"
    bench.mkdir()
    (bench / "reduced_error.csv.meta.json").write_text(json.dumps(
        {"captures": [f"data/study_tp/tp_runs/tp{tp}/bf16/seed0/traffic" for tp in (16, 2)]}))
    rc, err = freeze("b")
    assert rc == 2 and len(err) == 1 and "tp2/bf16/seed0" in err[0] and "reduced_error" in err[0], err
    assert "a batch the results leave out" in err[0], err
    (bench / "reduced_error.csv.meta.json").write_text(json.dumps(
        {"captures": ["data/study_tp/tp_runs/tp16/bf16/seed0/traffic"]}))
    # a benchmark of the later batch's run alone is carried with it, the run's capture measured
    (later / "traffic").mkdir()
    pd.DataFrame([{"tp": 2, "sqnr_db": 13.5, **PROV}]).to_csv(bench / "reduced_error_tp2.csv", index=False)
    (bench / "reduced_error_tp2.csv.meta.json").write_text(json.dumps(
        {"captures": ["data/study_tp/tp_runs/tp2/bf16/seed0/traffic"], "torch": PROV["torch"]}))
    rc, err = freeze("c")
    assert rc == 0, err
    with tarfile.open(tmp_path / "c" / "carried.tar.xz") as tar:
        carried = sorted(n for n in tar.getnames() if "/bench/" in n)
    assert carried == ["data/study_tp/bench/reduced_error_tp2.csv",
                       "data/study_tp/bench/reduced_error_tp2.csv.meta.json"], carried
    assert (tmp_path / "c/data/study_tp/bench/reduced_error.csv.meta.json").exists()
    assert not (tmp_path / "c/data/study_tp/bench/reduced_error_tp2.csv").exists()
    (bench / "reduced_error_tp2.csv").unlink()
    (bench / "reduced_error_tp2.csv.meta.json").unlink()
    shutil.rmtree(later)  # nothing left behind: the freeze is a whole one
    assert freeze("d")[0] == 0 and "partial" not in (tmp_path / "d/README.md").read_text().split("commit:")[1]
    for r in named:
        shutil.rmtree(r)
    tp_run(src / "tp_runs", 2, "fp4quant", 0, [2.0, 2.1, 2.05])
    rc, err = freeze("e")
    assert rc == 2 and len(err) == 1 and "name none of its 1 training runs" in err[0], err
