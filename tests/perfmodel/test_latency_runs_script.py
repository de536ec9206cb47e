"""scripts/latency_runs.py: its summary of two of the trainer's latency runs is the one committed with them."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from distributed import REPO

FOLDER = REPO / "tests/fixtures/latency_runs"  # two runs of scripts/latency_runs.sh (its README)


def test_the_committed_summary_is_the_scripts_output_on_the_committed_runs(tmp_path):
    out = tmp_path / "summary.csv"
    run = subprocess.run([sys.executable, "scripts/latency_runs.py", str(FOLDER.relative_to(REPO)), "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got, committed = pd.read_csv(out), pd.read_csv(FOLDER / "summary.csv")
    pd.testing.assert_frame_equal(got, committed)
    assert len(got) == 2 and set(got.batch_size) == {1, 2} and (got.steps == 24).all()
    empty = subprocess.run([sys.executable, "scripts/latency_runs.py", str(tmp_path), "--out", str(tmp_path / "x.csv")],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1 and "no runs" in empty.stderr
