"""Launch a multi-process job on gloo (or NCCL) and collect each rank's JSON result.

Each rank is a fresh ``python tests/comm/_comm_jobs.py JOB`` subprocess with RANK,
WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT in its environment (what torchrun sets),
writing its result to ``<out>/rank<r>.json``.  On a timeout, or as soon as one rank
fails, the launcher kills every rank it started (by process group) and raises with the
tail of each rank's output, so a hung collective never hangs the test suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distributed import _kill, free_port  # noqa: E402  (tests/ is on sys.path)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOBS = HERE / "_comm_jobs.py"


class JobFailed(RuntimeError):
    pass


def run(job: str, world: int, timeout: float = 150, backend: str = "gloo", env: dict[str, str] | None = None,
        args: list[str] | None = None) -> list[dict[str, Any]]:
    """Run ``job`` on ``world`` ranks; return the per-rank results (rank order)."""
    with tempfile.TemporaryDirectory(prefix="fp4quant-comm-") as tmp:
        out = Path(tmp)
        base = dict(os.environ)
        base.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
            FP4QUANT_TEST_BACKEND=backend,
            PYTHONPATH=os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        base.pop("FP4QUANT_VALIDATE", None)
        base.update(env or {})
        procs, logs = [], []
        try:
            for rank in range(world):
                log = open(out / f"rank{rank}.log", "w+")
                logs.append(log)
                procs.append(subprocess.Popen(
                    [sys.executable, str(JOBS), job, str(out / f"rank{rank}.json"), *(args or [])],
                    env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
                    stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                ))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    raise JobFailed(f"job {job!r} on {world} ranks timed out after {timeout:.0f} s")
                if any(p.poll() not in (None, 0) for p in procs):
                    time.sleep(2)  # let the other ranks print their side, then stop them
                    raise JobFailed(f"job {job!r} on {world} ranks: a rank failed")
                time.sleep(0.05)
        except JobFailed as exc:
            _kill(procs)
            tails = []
            for rank, log in enumerate(logs):
                log.seek(0)
                tails.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n" + log.read()[-4000:])
            raise JobFailed(str(exc) + "\n" + "\n".join(tails)) from None
        finally:
            _kill(procs)
            for log in logs:
                log.close()
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise JobFailed(f"job {job!r}: ranks {bad} failed:\n" + "\n".join(
                (out / f"rank{r}.log").read_text()[-4000:] for r in bad))
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
