"""The one launcher of the multi-process tests: N ranks as fresh processes, as torchrun would
start them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and a free MASTER_PORT set).

    results = run_ranks("parallel.rank_jobs:tp_matches_single", world=2, args={...})
    records = run_job("suite", world=4, backend="gloo")      # tests/comm/_comm_jobs.py

``run_ranks`` imports ``module`` (relative to tests/) on each rank and calls
``function(rank, world, **args)`` after ``init_process_group("gloo")``; what it returns is
pickled back (torch.save).  ``run_job`` runs ``python tests/comm/_comm_jobs.py JOB OUT``
on each rank (it sets up its own process group, gloo or NCCL) and returns each rank's JSON
record.  On a timeout, or as soon as one rank fails, every rank is killed (by process
group) and the test fails with each rank's output tail: a hung collective never hangs the
suite.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
COMM_JOBS = TESTS / "comm" / "_comm_jobs.py"

CHILD = """
import importlib, os, sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
module, function = {target!r}.split(":")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
args = torch.load({args!r}, weights_only=False)
result = getattr(importlib.import_module(module), function)(rank, world, **args)
torch.save(result, {out!r}.format(rank=rank))
dist.barrier()  # no rank tears its connections down while another still uses them
dist.destroy_process_group()
# Skip interpreter teardown: torch 2.13's gloo threads sometimes abort it ("terminate called
# without an active exception") after all work is done and saved.
sys.stdout.flush()
os._exit(0)
"""


class RanksFailed(AssertionError):
    """A rank failed or the job timed out; the message holds each rank's output tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(what: str, argv: list[str], world: int, folder: Path, timeout: float, env: dict[str, str] | None) -> None:
    """Run ``argv`` as ranks 0 .. world-1 (logs in ``folder``); return when all exit 0."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **(env or {})}
    procs, logs = [], []
    try:
        for rank in range(world):
            log = open(folder / f"rank{rank}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(argv, env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = any(p.poll() not in (None, 0) for p in procs)
            if failed or time.monotonic() > deadline:
                if failed:
                    time.sleep(1)  # let the others print their side
                _kill(procs)
                raise RanksFailed(_report(what, world, logs, procs, "a rank failed" if failed else
                                          f"timed out after {timeout:.0f} s"))
            time.sleep(0.05)
        if any(p.returncode for p in procs):
            raise RanksFailed(_report(what, world, logs, procs, "a rank failed"))
    finally:
        _kill(procs)
        for log in logs:
            log.close()


def run_ranks(target: str, world: int, args: dict[str, Any] | None = None, timeout: float = 120,
              env: dict[str, str] | None = None) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="fp4quant-ranks-") as tmp:
        tmp = Path(tmp)
        torch.save(args or {}, tmp / "args.pt")
        code = CHILD.format(tests=str(TESTS), target=target, args=str(tmp / "args.pt"), out=str(tmp / "rank{rank}.pt"))
        launch(target, [sys.executable, "-c", code], world, tmp, timeout, env)
        return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


def run_job(job: str, world: int, timeout: float = 150, backend: str = "gloo", env: dict[str, str] | None = None,
            args: list[str] | None = None) -> list[dict[str, Any]]:
    """Run ``job`` of tests/comm/_comm_jobs.py on ``world`` ranks; the per-rank records (rank order)."""
    with tempfile.TemporaryDirectory(prefix="fp4quant-comm-") as tmp:
        tmp = Path(tmp)
        argv = [sys.executable, str(COMM_JOBS), job, str(tmp / "rank{rank}.json"), *(args or [])]
        launch(f"job {job!r}", argv, world, tmp, timeout, {"FP4QUANT_TEST_BACKEND": backend, **(env or {})})
        return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _report(what, world, logs, procs, why) -> str:
    parts = [f"{what} on {world} ranks: {why}"]
    for r, log in enumerate(logs):
        log.seek(0)
        parts.append(f"--- rank {r} (exit {procs[r].returncode}) ---\n" + log.read()[-4000:])
    return "\n".join(parts)
