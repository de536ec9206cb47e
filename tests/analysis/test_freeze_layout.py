"""`python -m fp4quant.analysis freeze` writes the slim layout (fp4quant.analysis.freeze.slim): what a
reviewer reads as plain files, the raw logs in one raw.tar.xz under their paths, big CSVs xz'd --
on a small fake run holding every kind of file a workflow's run leaves."""

from __future__ import annotations

import json
import lzma
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.__main__ import main
from fp4quant.analysis.freeze import BIG_CSV_BYTES, RAW_ARCHIVE, is_raw, made_from_run, slim

ORIGIN = {"hardware": "AMD EPYC, 2 cores (CPU)", "commit": "c" * 40, "torch": "2.13.0+cpu"}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_run(folder: Path, comm: str, steps: int = 5) -> str:
    """A training run's folder as the trainer leaves it (summary.json, log.jsonl)."""
    cfg = {"model": "tiny", "comm": comm, "compress": "both", "compute": "exact", "seed": 0, "steps": steps,
           "seq_len": 64, "batch_size": 2, "eval_batches": 2, "data": "data/cpu/tokens", "out": str(folder)}
    write(folder / "summary.json", json.dumps({"provenance": {**ORIGIN, "config": cfg}, "steps": steps,
                                               "mesh": {"tp": 2, "dp": 1, "world": 2, "device": "cpu"},
                                               "model": {"hidden_size": 64}, "lr_schedule": [{"from_step": 0}]}))
    write(folder / "log.jsonl", "".join(json.dumps({"step": i, "loss": 3.0 - 0.1 * i}) + "\n" for i in range(steps)))
    return str(folder)


def stamp(path: Path) -> None:
    """A figure or table stamped as fp4quant.analysis.origin stamps them (only the stamp matters here)."""
    origin = json.dumps({**ORIGIN, "hardware": [ORIGIN["hardware"]], "profile": "cpu"}, sort_keys=True)
    if path.suffix == ".pdf":
        escaped = origin.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"%PDF-1.4\n/Keywords (" + escaped.encode() + b")\n%%EOF\n")
    else:
        write(path, f"\\begin{{table}}\n% provenance: {origin}\n\\end{{table}}\n")


@pytest.fixture
def run(tmp_path) -> Path:
    """A workflow's folder after a fake complete run of profile cpu: training runs, the jobs' logs,
    the unit tests' output, a validation folder, a big benchmark CSV, small results, figures, tables."""
    root = tmp_path / "run"
    data = root / "data/cpu"
    runs = [write_run(data / f"runs/tiny/{c}/seed0", c) for c in ("bf16", "fp4quant")]
    named = [str(Path(r).relative_to(root)) for r in runs]
    for name in ("training", "curves"):
        write(data / f"results/{name}.csv", pd.DataFrame([{"run": r, "val_loss": 2.0, **ORIGIN} for r in named])
              .to_csv(index=False))
    write(data / "logs/train_bf16_seed0.log", "step 0 loss 3.0\n")
    write(data / "logs/figure_error.log", "")
    write(data / "tests/junit.xml", '<testsuite tests="1"/>\n')
    write(data / "cluster/calibration.json", json.dumps({"provenance": ORIGIN, "rank_flops": 1e10}))
    case = data / "cluster/validation/repeat1/rate60"
    write(case / "probe.json", json.dumps({**ORIGIN, "world": 2}))
    write_run(case / "bf16", "bf16")
    write(case / "bf16/cluster.json", json.dumps({**ORIGIN, "emulated": True}))
    big = pd.DataFrame([{"size_bytes": 2 ** (i % 20), "gbps": i / 7, **ORIGIN} for i in range(1200)])
    write(data / "bench/kernels.csv", big.to_csv(index=False))
    assert (data / "bench/kernels.csv").stat().st_size > BIG_CSV_BYTES
    for p in made_from_run(root / "figures", root / "paper/tables", data):
        stamp(p)
    return root


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_frozen_run_keeps_what_a_reviewer_reads_and_packs_the_raw_logs(run, tmp_path):
    to = tmp_path / "ref"
    assert main(["freeze", "--profile", "cpu", "--to", str(to), "--data", str(run / "data"),
                 "--figures", str(run / "figures"), "--tables", str(run / "paper/tables")]) == 0
    plain = set(files_under(to))
    assert {f for f in plain if not f.startswith(("figures/", "tables/"))} == {
        "README.md", RAW_ARCHIVE, "data/cpu/bench/kernels.csv.xz", "data/cpu/cluster/calibration.json",
        "data/cpu/results/training.csv", "data/cpu/results/curves.csv",
        "data/cpu/runs/tiny/bf16/seed0/summary.json", "data/cpu/runs/tiny/fp4quant/seed0/summary.json"}
    raw = [f"data/cpu/{p}" for p in ("cluster/validation/repeat1/rate60/bf16/cluster.json",
                                     "cluster/validation/repeat1/rate60/bf16/log.jsonl",
                                     "cluster/validation/repeat1/rate60/bf16/summary.json",
                                     "cluster/validation/repeat1/rate60/probe.json", "logs/figure_error.log",
                                     "logs/train_bf16_seed0.log", "runs/tiny/bf16/seed0/log.jsonl",
                                     "runs/tiny/fp4quant/seed0/log.jsonl", "tests/junit.xml")]
    with tarfile.open(to / RAW_ARCHIVE) as tar:
        assert tar.getnames() == raw  # in order, relative to the reference folder
        assert all(m.uid == 0 and m.uname == "" for m in tar.getmembers())
    # no folder left empty by the packing
    assert not [d for d in to.rglob("*") if d.is_dir() and not any(d.iterdir())]
    assert not (to / "data/cpu/logs").exists() and not (to / "data/cpu/cluster/validation").exists()
    # pandas reads the big CSV as it is, and unpacking gives back the run's files
    pd.testing.assert_frame_equal(pd.read_csv(to / "data/cpu/bench/kernels.csv.xz"),
                                  pd.read_csv(run / "data/cpu/bench/kernels.csv"))
    with tarfile.open(to / RAW_ARCHIVE) as tar:
        tar.extractall(to, filter="data")
    for xz in to.rglob("*.csv.xz"):
        xz.with_name(xz.name[:-3]).write_bytes(lzma.decompress(xz.read_bytes()))
        xz.unlink()
    (to / RAW_ARCHIVE).unlink()
    made_relative = {k: v.replace(f"{run.resolve()}/".encode(), b"") for k, v in files_under(run / "data/cpu").items()}
    assert files_under(to / "data/cpu") == made_relative  # as freeze copies them: the run's folder made relative
    # the README says so first
    readme = (to / "README.md").read_text().splitlines()
    assert readme[0].startswith("# Reference results") and readme[2].startswith("Kept small: the raw logs (")
    assert "9 files) are packed into `raw.tar.xz`" in readme[2] and "`tar -xJf raw.tar.xz`" in readme[2]
    assert "`data/cpu/bench/kernels.csv`, the one CSV over 64 KB, is xz-compressed" in readme[2]


def test_slim_refuses_a_folder_already_slim_and_leaves_a_small_run_as_it_is(tmp_path):
    folder = tmp_path / "ref"
    write(folder / "results/training.csv", "run,val_loss\nr,2.0\n")
    write(folder / "logs/a.log", "x\n")
    assert slim(folder) == {"packed": ["logs/a.log"], "compressed": []}
    with pytest.raises(FileExistsError, match="slim already"):
        slim(folder)
    assert files_under(folder).keys() == {"results/training.csv", RAW_ARCHIVE}


@pytest.mark.parametrize("path, raw", [
    ("data/cpu/runs/tiny/bf16/seed0/log.jsonl", True), ("data/cpu/logs/train_bf16_seed0.log", True),
    ("data/cpu/tests/junit.xml", True), ("data/cpu/cluster/validation/repeat1/rate60/probe.json", True),
    ("data/cpu/cluster/validation/repeat1/rate60/bf16/summary.json", True), ("logs/train_bf16_seed0.log", True),
    ("data/cpu/runs/tiny/bf16/seed0/summary.json", False), ("data/cpu/cluster/calibration.json", False),
    ("data/cpu/results/model_validation.csv", False), ("figures/validation.pdf", False), ("README.md", False),
    ("data/cpu/results/validation", False),  # a file named like a raw folder is no folder
])
def test_what_counts_as_a_raw_log(path, raw):
    assert is_raw(Path(path)) is raw
