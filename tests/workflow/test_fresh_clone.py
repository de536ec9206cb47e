"""A fresh clone computes every result itself: nothing committed counts as an up-to-date output,
and a training rerun for other code or arguments starts afresh (scripts/fresh_run.py)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fp4quant.analysis.figures import FIGURES

REPO = Path(__file__).resolve().parents[2]


def planned(cwd: Path, snakefile: Path) -> dict[str, int]:
    """The jobs a dry run of the default configuration plans, by rule."""
    r = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "-n", "--cores", "2", "all"],
                       cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    stats = r.stdout.split("Job stats:")[1].split("\n\n")[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)}


def source_files() -> list[str]:
    """What a clone of the current tree holds: tracked files and new ones that are not ignored."""
    r = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip("not a git checkout")
    return [f for f in r.stdout.splitlines() if (REPO / f).is_file()]


def test_a_fresh_clone_plans_to_compute_everything(tmp_path):
    clone = tmp_path / "clone"
    for f in source_files():
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, clone / f)
    empty = tmp_path / "empty"
    empty.mkdir()
    everything = planned(empty, REPO / "Snakefile")
    # every training run and figure of the default configuration
    config = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
    train = config["train"]
    trained = [a for a in config["ablations"] if a != "naive_pack"]  # naive_pack sends fp4quant's bytes: no run
    runs = len(train["comms"]) * len(train["seeds"]) + len(trained) * len(train.get("ablation_seeds", train["seeds"]))
    assert everything["train"] == runs == 8  # on the launcher: their wall time is no result
    assert all(everything[f"ablation_{a}"] == 1 for a in config["ablations"])  # each ablation's CSV too
    assert "naive_pack" in config["ablations"]
    throughput = config["cluster"]["throughput"]
    assert everything["cluster_train"] == len(throughput["comms"]) * len(throughput["seeds"]) == 6
    assert everything["regime"] == everything["collect_throughput"] == 1
    assert everything["figure"] + everything["traffic_figure"] == len(FIGURES)  # traffic has a rule of its own
    # the paper's PDF is built where its source is and latexmk is installed: in the clone, not the empty folder
    expected = dict(everything)
    if shutil.which("latexmk"):
        expected.update(paper_pdf=1, total=everything["total"] + 1)
    assert "paper_pdf" not in everything and planned(clone, clone / "Snakefile") == expected


def _fresh_run():
    spec = importlib.util.spec_from_file_location("fresh_run", REPO / "workflow/scripts/fresh_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_training_rerun_resumes_only_a_run_of_the_same_job(tmp_path):
    fresh_run = _fresh_run()
    run, data = tmp_path / "run", tmp_path / "meta.json"
    data.write_text("{}")
    assert not fresh_run.prepare(run, "commit A, args", [str(data)])
    (run / "checkpoints").mkdir()
    assert fresh_run.prepare(run, "commit A, args", [str(data)])  # an interrupted run of this job: resumed
    assert (run / "checkpoints").exists()
    assert not fresh_run.prepare(run, "commit B, args", [str(data)])  # other code: afresh
    assert not (run / "checkpoints").exists()
    (run / "checkpoints").mkdir()
    data.write_text('{"vocab_size": 1}')
    assert not fresh_run.prepare(run, "commit B, args", [str(data)])  # other data: afresh
    assert not (run / "checkpoints").exists()
    (run / "workflow_job.json").unlink()
    (run / "checkpoints").mkdir()
    assert not fresh_run.prepare(run, "commit B, args", [str(data)])  # a run of unknown origin: afresh
    assert not (run / "checkpoints").exists()
