"""examples/: each runs as its docstring says (under torchrun, on gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from distributed import REPO

pytestmark = pytest.mark.timeout(300)


def test_hf_tp_train_compresses_both_directions_and_learns():
    pytest.importorskip("transformers")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "examples/hf_tp_train.py", "--steps", "20"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    steps, stats = lines[:-1], lines[-1]
    assert [r["step"] for r in steps] == list(range(20))
    assert sum(r["loss"] for r in steps[-5:]) < sum(r["loss"] for r in steps[:5])
    for direction in ("fwd", "bwd"):
        s = stats[direction]
        assert s["calls"] > 0 and s["bytes_sent"] < s["bytes_uncompressed"] / 4, (direction, s)
