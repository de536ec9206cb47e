"""`python -m fp4quant.analysis freeze`: a complete, consistent run into a reference folder, or a one-line refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.figures import FIGURES
from fp4quant.analysis.tables import TABLES
from fp4quant.perfmodel import sensitivity
from fp4quant.provenance import atomic_write_csv

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference/cpu-amd-epyc-2core/data/cpu"
PREDATED = {"traffic", "breakdown", "validation", "model_validation"}


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory) -> Path:
    """A workflow's folder after a complete run (profile cpu), remade from the reference's raw results."""
    root = tmp_path_factory.mktemp("run")
    data = root / "data/cpu"
    shutil.copytree(REFERENCE, data, ignore=shutil.ignore_patterns("results"))
    (data / "results").mkdir()
    shutil.copy(REFERENCE / "results/projection.csv", data / "results")
    shutil.copy(REFERENCE / "results/projection.csv.meta.json", data / "results")
    # the reference predates the sensitivity sweep: made here, stamped with the reference's origin
    origin = pd.read_csv(REFERENCE / "results/projection.csv").iloc[0]
    atomic_write_csv(data / "results/projection_sensitivity.csv",
                     [{**r, "commit": origin.commit, "torch": origin.torch} for r in sensitivity.sweep()])
    (data / "tokens").mkdir()
    (data / "tokens/tokens.bin").write_bytes(b"\0" * 64)  # never frozen
    (data / "cluster/runs/tiny/bf16/seed0/workflow_job.json").write_text('{"key": "/home/someone/fp4quant ..."}')  # nor this
    (data / "logs/paths.log").write_text(f"loaded {root.resolve()}/.venv/lib/x.so\n")  # the run's folder, made relative
    bench = data / "bench"
    runs = [str(p) for p in sorted((data / "cluster/runs/tiny").glob("*/seed0"))]
    assert main(["collect", "--profile", "cpu", "--runs", *runs, "--error", str(bench / "error.csv"),
                 "--kernels", str(bench / "kernels.csv"), "--collectives", str(bench / "collectives.csv"),
                 "--ablations", "no_fwht", "single_scale", "naive_pack", "--out-dir", str(data / "results")]) == 0
    # the reference predates the throughput runs: its training runs stand for them
    assert main(["throughput", "--profile", "cpu", "--runs", *runs, "--warmup", "30",
                 "--out", str(data / "results/throughput.csv")]) == 0
    for kind, names, folder, ext in (("figure", FIGURES, "figures", "pdf"), ("table", TABLES, "paper/tables", "tex")):
        for name in names:
            # the reference predates the traffic benchmark, the split codec timers (breakdown) and the
            # model's part-by-part validation (all optional to freeze)
            if name in PREDATED:
                continue
            assert main([kind, name, "--results", str(data / "results"), "--profile", "cpu",
                         "--out", str(root / folder / f"{name}.{ext}")]) == 0
    return root


def freeze(root: Path, to: Path, data: Path | None = None) -> int:
    return main(["freeze", "--profile", "cpu", "--to", str(to), "--data", str(data or root / "data"),
                 "--figures", str(root / "figures"), "--tables", str(root / "paper/tables")])


def test_a_complete_run_is_frozen_with_a_readme(complete_run, tmp_path):
    to = tmp_path / "reference/cpu-test"
    assert freeze(complete_run, to) == 0
    assert sorted(p.name for p in (to / "figures").iterdir()) == sorted(f"{n}.pdf" for n in FIGURES if n not in PREDATED)
    assert sorted(p.name for p in (to / "tables").iterdir()) == sorted(f"{n}.tex" for n in TABLES if n not in PREDATED)
    # the results as they are, but for the run's folder: its runs are named relative to it
    training = (complete_run / "data/cpu/results/training.csv").read_text()
    assert f"{complete_run.resolve()}/" in training
    assert (to / "data/cpu/results/training.csv").read_text() == training.replace(f"{complete_run.resolve()}/", "")
    assert (to / "data/cpu/cluster/runs/tiny/fp4quant/seed0/log.jsonl").exists()
    assert not (to / "data/cpu/tokens").exists()
    assert not (to / "data/cpu/cluster/runs/tiny/bf16/seed0/workflow_job.json").exists()
    assert (to / "data/cpu/logs/paths.log").read_text() == "loaded .venv/lib/x.so\n"
    readme = (to / "README.md").read_text()
    assert "AMD EPYC, 2 cores (CPU)" in readme and "b82b982c63ea3095b56c3dc3adc93120accbd3de" in readme
    assert "produced by: `make figures`" in readme and "torch: 2.13.0+cpu" in readme
    assert freeze(complete_run, to) == 2  # never over an existing reference


def test_a_mixed_run_is_refused(complete_run, tmp_path, capfd):
    data = tmp_path / "data"
    shutil.copytree(complete_run / "data", data)
    kernels = data / "cpu/bench/kernels.csv"
    df = pd.read_csv(kernels)
    df["hardware"] = "Intel Xeon, 2 cores (CPU)"
    df.to_csv(kernels, index=False)
    assert freeze(complete_run, tmp_path / "ref", data) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Intel Xeon" in err and "bench/kernels.csv" in err
    assert not (tmp_path / "ref").exists()


def test_figures_of_another_profile_or_missing_ones_are_refused(complete_run, tmp_path, capfd):
    root = tmp_path / "run"
    shutil.copytree(complete_run, root)
    results = root / "data/cpu/results"
    assert main(["figure", "error", "--results", str(results), "--profile", "cpu-loopback",
                 "--out", str(root / "figures/error.pdf")]) == 0
    assert freeze(root, tmp_path / "ref") == 2
    assert "error.pdf was made for profile cpu-loopback, not cpu" in capfd.readouterr().err
    (root / "figures/error.pdf").unlink()
    assert freeze(root, tmp_path / "ref") == 2
    assert "error.pdf is missing: the run is not complete" in capfd.readouterr().err
