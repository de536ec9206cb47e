"""`python -m fp4quant.analysis freeze`: a complete, consistent run into a reference folder, or a one-line refusal."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.figures import FIGURES
from fp4quant.perfmodel import topology
from fp4quant.analysis.tables import TABLES
from fp4quant.perfmodel import sensitivity
from fp4quant.provenance import atomic_write_csv

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/freeze/data/cpu"  # a real run's raw material, cut down (its README)
COMMIT = "27703e115b0d4771e0a8ab7935494a4b873a5a1b"
# made from the step model's validation on the emulated cluster, which the fixture leaves out
# (optional to freeze, as for a run without the emulated cluster)
WITHOUT = {"validation", "model_validation"}


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory) -> Path:
    """A workflow's folder after a complete run (profile cpu), remade from the fixture's raw results
    as the workflow's analysis steps make them."""
    root = tmp_path_factory.mktemp("run")
    data = root / "data/cpu"
    shutil.copytree(FIXTURE, data)
    results, bench = data / "results", data / "bench"
    # the sensitivity sweep (a projection, no measurement): stamped with the run's origin
    origin = pd.read_csv(results / "projection.csv").iloc[0]
    atomic_write_csv(results / "projection_sensitivity.csv",
                     [{**r, "commit": origin.commit, "torch": origin.torch} for r in sensitivity.sweep()])
    # the projection by topology (projected too): stamped alike
    atomic_write_csv(results / "projection_clusters.csv",
                     [{**r, "hardware": "H100 (assumed)", "commit": origin.commit, "torch": origin.torch}
                      for r in topology.table()])
    (data / "tokens").mkdir()
    (data / "tokens/tokens.bin").write_bytes(b"\0" * 64)  # never frozen
    (data / "runs/tiny/bf16/seed0/workflow_job.json").write_text('{"key": "/home/someone/fp4quant ..."}')  # nor this
    (data / "logs").mkdir()
    (data / "logs/paths.log").write_text(f"loaded {root.resolve()}/.venv/lib/x.so\n")  # the run's folder, made relative
    runs = [str(p) for p in sorted((data / "runs/tiny").glob("*/seed0"))]
    throughput = [str(p) for p in sorted((data / "cluster/throughput/tiny").glob("*/seed0"))]
    assert main(["collect", "--profile", "cpu", "--runs", *runs, "--error", str(bench / "error.csv"),
                 "--kernels", str(bench / "kernels.csv"), "--collectives", str(bench / "collectives.csv"),
                 "--ablations", "no_fwht", "single_scale", "naive_pack", "--out-dir", str(results)]) == 0
    assert main(["throughput", "--profile", "cpu", "--runs", *throughput, "--warmup", "1",
                 "--out", str(results / "throughput.csv"), "--breakdown-out", str(results / "breakdown.csv")]) == 0
    for kind, names, folder, ext in (("figure", FIGURES, "figures", "pdf"), ("table", TABLES, "paper/tables", "tex")):
        for name in names:
            if name in WITHOUT:
                continue
            source = bench if name == "traffic" else results  # traffic: the folder of bench/traffic.csv
            assert main([kind, name, "--results", str(source), "--profile", "cpu",
                         "--out", str(root / folder / f"{name}.{ext}")]) == 0
    return root


def freeze(root: Path, to: Path, data: Path | None = None) -> int:
    return main(["freeze", "--profile", "cpu", "--to", str(to), "--data", str(data or root / "data"),
                 "--figures", str(root / "figures"), "--tables", str(root / "paper/tables")])


def test_a_complete_run_is_frozen_slim_with_a_readme(complete_run, tmp_path):
    to = tmp_path / "reference/cpu-test"
    assert freeze(complete_run, to) == 0
    assert sorted(p.name for p in (to / "figures").iterdir()) == sorted(f"{n}.pdf" for n in FIGURES if n not in WITHOUT)
    assert sorted(p.name for p in (to / "tables").iterdir()) == sorted(f"{n}.tex" for n in TABLES if n not in WITHOUT)
    # the results as they are, but for the run's folder: its runs are named relative to it
    training = (complete_run / "data/cpu/results/training.csv").read_text()
    assert f"{complete_run.resolve()}/" in training
    assert (to / "data/cpu/results/training.csv").read_text() == training.replace(f"{complete_run.resolve()}/", "")
    # the raw logs in one archive under their paths, the summaries beside it as plain files
    assert (to / "data/cpu/runs/tiny/fp4quant/seed0/summary.json").exists()
    assert not (to / "data/cpu/runs/tiny/fp4quant/seed0/log.jsonl").exists() and not (to / "data/cpu/logs").exists()
    with tarfile.open(to / "raw.tar.xz") as tar:
        names = set(tar.getnames())
        assert tar.extractfile("data/cpu/logs/paths.log").read() == b"loaded .venv/lib/x.so\n"
    assert {"data/cpu/runs/tiny/fp4quant/seed0/log.jsonl", "data/cpu/cluster/throughput/tiny/bf16/seed0/log.jsonl",
            "data/cpu/logs/paths.log"} <= names
    # a CSV over 64 KB xz-compressed in place, as pandas reads it
    big = complete_run / "data/cpu/results/projection_sensitivity.csv"
    assert big.stat().st_size > 64_000 and not (to / "data/cpu/results/projection_sensitivity.csv").exists()
    pd.testing.assert_frame_equal(pd.read_csv(to / "data/cpu/results/projection_sensitivity.csv.xz"), pd.read_csv(big))
    assert not (to / "data/cpu/tokens").exists() and not any("tokens" in n for n in names)
    assert not (to / "data/cpu/runs/tiny/bf16/seed0/workflow_job.json").exists()
    assert not any(n.endswith("workflow_job.json") for n in names)
    readme = (to / "README.md").read_text()
    assert "AMD EPYC, 2 cores (CPU)" in readme and COMMIT in readme
    assert "produced by: `make figures`" in readme and "torch: 2.13.0+cpu" in readme
    assert "`tar -xJf raw.tar.xz` in this folder puts them back" in readme
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
    # the step breakdown and the traffic figure are the workflow's on every run: never optional
    shutil.copy(complete_run / "figures/error.pdf", root / "figures/error.pdf")
    (root / "figures/breakdown.pdf").unlink()
    assert freeze(root, tmp_path / "ref") == 2
    assert "breakdown.pdf is missing" in capfd.readouterr().err
