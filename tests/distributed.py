"""Run a test function on N gloo ranks (fresh processes, as torchrun would start them).

    results = run_ranks("parallel.rank_jobs:tp_matches_single", world=2, args={...})

Each rank imports ``module`` (relative to tests/) and calls ``function(rank, world, **args)``
after ``init_process_group("gloo")``; what it returns is pickled back (torch.save).  On
a timeout, or when a rank fails, every rank is killed (process group) and the test
fails with each rank's output tail: a hung collective never hangs the suite.
"""

from __future__ import annotations

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: str, world: int, args: dict[str, Any] | None = None, timeout: float = 120,
              env: dict[str, str] | None = None) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="fp4quant-ranks-") as tmp:
        tmp = Path(tmp)
        torch.save(args or {}, tmp / "args.pt")
        code = CHILD.format(tests=str(TESTS), target=target, args=str(tmp / "args.pt"), out=str(tmp / "rank{rank}.pt"))
        base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
                "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
        procs, logs = [], []
        try:
            for rank in range(world):
                log = open(tmp / f"rank{rank}.log", "w+")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, "-c", code], env={**base, "RANK": str(rank)},
                                              stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                failed = any(p.poll() not in (None, 0) for p in procs)
                if failed or time.monotonic() > deadline:
                    if failed:
                        time.sleep(1)  # let the others print their side
                    _kill(procs)
                    raise AssertionError(_report(target, world, logs, "timed out" if not failed else "a rank failed"))
                time.sleep(0.05)
            if any(p.returncode for p in procs):
                raise AssertionError(_report(target, world, logs, "a rank failed"))
            return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]
        finally:
            _kill(procs)
            for log in logs:
                log.close()


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _report(target, world, logs, what) -> str:
    parts = [f"{target} on {world} ranks: {what}"]
    for r, log in enumerate(logs):
        log.seek(0)
        parts.append(f"--- rank {r} ---\n" + log.read()[-3000:])
    return "\n".join(parts)
