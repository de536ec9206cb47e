"""One figure set never mixes machines, commits or torch versions (fp4quant.analysis.origin)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.origin import MixedOrigin, check_same_origin, read_stamp, records

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/origin/data/cpu"  # a real run's files, cut down (its README)
AMD, INTEL = "AMD EPYC, 2 cores (CPU)", "Intel Xeon, 2 cores (CPU)"
A, B = "a" * 40, "b" * 40


def summary(folder: Path, hardware=AMD, commit=A, torch="2.13.0+cpu") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(
        {"provenance": {"hardware": hardware, "commit": commit, "torch": torch, "config": {}}}))
    return folder / "summary.json"


def bench_csv(path: Path, hardware=AMD, commit=A, torch="2.13.0+cpu") -> Path:
    pd.DataFrame([{"op": "quantize", "gbps": 1.0, "hardware": hardware, "commit": commit, "torch": torch}]).to_csv(
        path, index=False)
    return path


def test_a_consistent_set_is_accepted(tmp_path):
    origin = check_same_origin([summary(tmp_path / "r1"), tmp_path / "r1", bench_csv(tmp_path / "k.csv")])
    assert origin == {"hardware": [AMD], "commit": A, "torch": "2.13.0+cpu"}


@pytest.mark.parametrize("field, other, shown", [("hardware", INTEL, INTEL), ("commit", B, "bbbbbbbbbbbb"),
                                                 ("torch", "2.12.0+cpu", "torch 2.12.0+cpu")])
def test_a_mix_is_refused_in_one_line_naming_both_inputs(tmp_path, field, other, shown):
    first = summary(tmp_path / "run")
    second = bench_csv(tmp_path / "kernels.csv", **{field: other})
    with pytest.raises(MixedOrigin) as info:
        check_same_origin([first, second])
    message = str(info.value)
    assert "\n" not in message
    assert str(first) in message and str(second) in message and shown in message
    assert "figures-clean" in message  # and how to fix it


def test_rows_of_one_table_are_checked_and_named_by_run(tmp_path):
    training = tmp_path / "training.csv"
    pd.DataFrame([{"run": "runs/bf16", "hardware": AMD, "commit": A, "torch": "t"},
                  {"run": "runs/fp4quant", "hardware": AMD, "commit": B, "torch": "t"}]).to_csv(training, index=False)
    with pytest.raises(MixedOrigin, match=r"training.csv \(run runs/bf16\) comes from aaaaaaaaaaaa but .*"
                                          r"training.csv \(run runs/fp4quant\) from bbbbbbbbbbbb"):
        check_same_origin([training])


def test_cpu_beside_gpu_is_not_a_mix_but_two_gpus_are(tmp_path):
    gpu = "NVIDIA H100 80GB HBM3 (8 visible)"
    check_same_origin([summary(tmp_path / "r", hardware=gpu), bench_csv(tmp_path / "e.csv", hardware=AMD),
                       bench_csv(tmp_path / "k.csv", hardware="NVIDIA H100 80GB HBM3 (1 visible)"),
                       bench_csv(tmp_path / "p.csv", hardware="H100 (assumed)")])  # a projection, not a machine
    with pytest.raises(MixedOrigin, match="NVIDIA A100"):
        check_same_origin([summary(tmp_path / "r", hardware=gpu), bench_csv(tmp_path / "k.csv", hardware="NVIDIA A100 (8 visible)")])


def test_an_input_without_provenance_is_refused(tmp_path):
    bare = tmp_path / "bare.csv"
    pd.DataFrame([{"step": 0, "loss": 1.0}]).to_csv(bare, index=False)
    with pytest.raises(MixedOrigin, match="bare.csv records no provenance"):
        check_same_origin([bare])
    with pytest.raises(FileNotFoundError, match="nothing.json: no such file"):
        records(tmp_path / "nothing.json")


def test_a_real_runs_files_come_from_one_origin():
    files = [p for p in FIXTURE.rglob("*") if p.suffix in (".csv", ".json") and not p.name.endswith(".meta.json")]
    assert len(files) == 7  # two run summaries, three benchmarks, two tidy results
    assert check_same_origin(files) == {"hardware": [AMD], "commit": "27703e115b0d4771e0a8ab7935494a4b873a5a1b",
                                        "torch": "2.13.0+cpu"}


def test_collect_and_figures_refuse_a_mixed_set(tmp_path, capfd):
    data = tmp_path / "cpu"
    shutil.copytree(FIXTURE, data)
    kernels = data / "bench/kernels.csv"
    df = pd.read_csv(kernels)
    df["hardware"], df["commit"] = INTEL, B  # measured on another machine, at another commit
    df.to_csv(kernels, index=False)
    runs = [str(p) for p in sorted((data / "runs/tiny").glob("*/seed0"))]
    args = ["--runs", *runs, "--error", str(data / "bench/error.csv"), "--kernels", str(kernels)]
    assert main(["collect", "--profile", "cpu", *args, "--collectives", str(data / "bench/collectives.csv"),
                 "--out-dir", str(tmp_path / "results")]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fp4quant.analysis: error: mixed results: ")
    assert "kernels.csv" in err and "summary.json" in err

    # tidy results of two origins (as a partial rerun would leave them): no figure, no table
    results = data / "results"
    for name in ("training", "throughput"):
        df = pd.read_csv(results / f"{name}.csv")
        df.loc[0, "commit"] = B
        df.to_csv(results / f"{name}.csv", index=False)
    throughput_run, training_run = "data/cpu/cluster/throughput/tiny/bf16/seed0", "data/cpu/runs/tiny/bf16/seed0"
    for command, first in ((["figure", "throughput"], f"throughput.csv (run {throughput_run})"),
                           (["table", "end_to_end"], f"training.csv (run {training_run})")):
        out = tmp_path / "out"
        assert main([*command, "--results", str(results), "--profile", "cpu", "--out", str(out)]) == 2
        assert not out.exists()
        assert f"{first} comes from bbbbbbbbbbbb" in capfd.readouterr().err


def test_figures_and_tables_carry_their_provenance(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURE / "results", results)
    assert main(["figure", "throughput", "--results", str(results), "--profile", "cpu",
                 "--out", str(tmp_path / "t.pdf")]) == 0
    assert main(["table", "end_to_end", "--results", str(results), "--profile", "cpu",
                 "--out", str(tmp_path / "t.tex")]) == 0
    for made in ("t.pdf", "t.tex"):
        stamp = read_stamp(tmp_path / made)
        assert stamp["hardware"] == [AMD] and stamp["commit"].startswith("27703e1") and stamp["profile"] == "cpu"
        assert records(tmp_path / made)[0][1] == {"hardware": AMD, "commit": stamp["commit"], "torch": "2.13.0+cpu"}


def test_a_torn_input_is_one_line(tmp_path):
    torn = tmp_path / "summary.json"
    torn.write_text('{"provenance": {"hardw')
    with pytest.raises(MixedOrigin, match=r"summary.json cannot be read \(JSONDecodeError"):
        check_same_origin([torn])
