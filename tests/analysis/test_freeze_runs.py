"""`python -m fp4quant.analysis freeze` and the training runs it freezes: each complete, and the runs
each result table compares belonging together (fp4quant.analysis.comparable), on a small fake run."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.freeze import made_from_run

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def write_run(folder: Path, comm: str, steps: int = 30, seq_len: int = 64) -> str:
    """A training run's folder as the trainer (and the workflow, its resume key) leaves it."""
    folder.mkdir(parents=True)
    cfg = {"model": "tiny", "comm": comm, "compress": "both", "compute": "exact", "seed": 0, "steps": steps,
           "seq_len": seq_len, "batch_size": 2, "eval_batches": 2, "data": "data/cpu/tokens", "out": str(folder)}
    summary = {"provenance": {**ORIGIN, "config": cfg}, "mesh": {"tp": 2, "dp": 1, "world": 2, "device": "cpu"},
               "model": {"hidden_size": 64}, "steps": steps, "lr_schedule": [{"from_step": 0, "steps": steps}],
               "val_loss": 2.0, "val_batch_losses": [2.0, 2.0]}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "log.jsonl").write_text("".join(json.dumps({"step": i, "loss": 3.0}) + "\n" for i in range(steps)))
    (folder / "workflow_job.json").write_text("{}")
    return str(folder)


def stamp(path: Path, profile: str = "cpu") -> None:
    """A figure or table stamped as fp4quant.analysis.origin stamps them (only the stamp matters here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    origin = json.dumps({**ORIGIN, "hardware": [ORIGIN["hardware"]], "profile": profile}, sort_keys=True)
    if path.suffix == ".pdf":
        escaped = origin.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        path.write_bytes(b"%PDF-1.4\n/Keywords (" + escaped.encode() + b")\n%%EOF\n")
    else:
        path.write_text(f"\\begin{{table}}\n% provenance: {origin}\n\\end{{table}}\n")


def table(path: Path, runs: list[str]) -> None:
    """A result table of the runs, named as the workflow names them (relative to the folder it ran in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"run": r, "val_loss": 2.0, **ORIGIN} for r in runs]).to_csv(path, index=False)


@pytest.fixture
def run(tmp_path) -> Path:
    """A workflow's folder after a complete run of profile cpu: two training runs compared in its
    tables, two throughput runs of another shape compared in theirs, the figures and tables."""
    root = tmp_path / "run"
    data = root / "data/cpu"
    training = [write_run(data / f"runs/tiny/{c}/seed0", c) for c in ("bf16", "fp4quant")]
    throughput = [write_run(data / f"cluster/throughput/tiny/{c}/seed0", c, steps=5, seq_len=512)
                  for c in ("bf16", "fp4quant")]
    named = lambda runs: [str(Path(r).relative_to(root)) for r in runs]  # noqa: E731
    for name in ("training", "curves"):
        table(data / f"results/{name}.csv", named(training))
    table(data / "results/throughput.csv", named(throughput))
    for p in made_from_run(root / "figures", root / "paper/tables", data):
        stamp(p)
    return root


def freeze(root: Path, to: Path) -> int:
    return main(["freeze", "--profile", "cpu", "--to", str(to), "--data", str(root / "data"),
                 "--figures", str(root / "figures"), "--tables", str(root / "paper/tables")])


def test_a_complete_run_of_runs_that_belong_together_is_frozen(run, tmp_path):
    assert freeze(run, tmp_path / "ref") == 0  # throughput runs of their own shape, compared among themselves
    assert (tmp_path / "ref/data/cpu/runs/tiny/fp4quant/seed0/summary.json").exists()
    with tarfile.open(tmp_path / "ref/raw.tar.xz") as tar:  # the raw logs packed (freeze.slim)
        assert "data/cpu/runs/tiny/fp4quant/seed0/log.jsonl" in tar.getnames()


@pytest.mark.parametrize("deleted", [("summary.json", "log.jsonl"), ("log.jsonl",), ("summary.json",)])
def test_an_incomplete_training_run_is_refused(run, tmp_path, capfd, deleted):
    folder = run / "data/cpu/runs/tiny/fp4quant/seed0"
    for name in deleted:
        (folder / name).unlink()
    assert freeze(run, tmp_path / "ref") == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{folder}: {' and '.join(deleted)} missing: the training run is not complete" in err
    assert not (tmp_path / "ref").exists()


def test_a_run_a_table_names_but_the_folder_lacks_is_refused(run, tmp_path, capfd):
    shutil.rmtree(run / "data/cpu/cluster/throughput/tiny/fp4quant/seed0")  # nothing left to mark it a run
    assert freeze(run, tmp_path / "ref") == 2
    assert "throughput/tiny/fp4quant/seed0: summary.json and log.jsonl missing" in capfd.readouterr().err


def test_a_table_comparing_runs_that_do_not_belong_together_is_refused(run, tmp_path, capfd):
    other = run / "data/cpu/runs/tiny/fp4quant/seed0"
    shutil.rmtree(other)
    write_run(other, "fp4quant", steps=60)  # trained twice as long as the BF16 run it is compared with
    assert freeze(run, tmp_path / "ref") == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "results/curves.csv: runs differ in steps: 30 (run " in err
    assert f"60 (run {other})" in err and not (tmp_path / "ref").exists()
