"""The one launcher of the multi-process tests: N ranks as torchrun would start them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and a free MASTER_PORT set), each its own process and session.

    results = run_ranks("parallel.rank_jobs:tp_matches_single", world=2, args={...})
    records = run_job("suite", world=4, backend="gloo")      # tests/comm/_comm_jobs.py

``run_ranks`` imports ``module`` (relative to tests/) on each rank and calls
``function(rank, world, **args)`` after ``init_process_group("gloo")``; what it returns is
pickled back (torch.save).  ``run_job`` runs ``python tests/comm/_comm_jobs.py JOB OUT``
on each rank (it sets up its own process group, gloo or NCCL) and returns each rank's JSON
record.  On a timeout, or as soon as one rank fails, every rank is killed (by process
group) and the test fails with each rank's output tail: a hung collective never hangs the
suite.

The ranks are forked from a rank zygote (rank_zygote.py: torch and fp4quant imported once
a test worker), which saves each rank its imports; where the ranks' environment differs from
the zygote's in anything but the rank variables (a test that sets FP4QUANT_BACKEND, say, which
is read at import), or the zygote cannot fork safely, they start as fresh processes instead.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rank_watch import watch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
COMM_JOBS = TESTS / "comm" / "_comm_jobs.py"
# read by the ranks at run time only: a rank forked from the zygote may differ from it in these
RANK_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FP4QUANT_TEST_BACKEND",
                  "PYTEST_CURRENT_TEST"}

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


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What every rank (and the zygote) runs with, beside ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **(extra or {})}


class Zygote:
    """The client of one rank_zygote.py process (see there)."""

    def __init__(self) -> None:
        self.env, self.requests, self.unread = rank_environment(), 0, b""
        self.proc = subprocess.Popen([sys.executable, str(TESTS / "rank_zygote.py")], env=self.env, cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self._reply(300) != {"ready": True}:
            self.proc.kill()
            raise RuntimeError("the rank zygote did not start")

    def _reply(self, timeout: float) -> dict | None:
        """The zygote's next answer, or None when none comes within ``timeout`` seconds (lines are
        read from the pipe directly: a buffered reader could hold a second answer select cannot see)."""
        deadline, fd = time.monotonic() + timeout, self.proc.stdout.fileno()
        while b"\n" not in self.unread:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.unread += chunk
        line, self.unread = self.unread.split(b"\n", 1)
        return json.loads(line)

    def suits(self, env: dict[str, str]) -> bool:
        keys = (env.keys() | self.env.keys()) - RANK_VARIABLES
        return self.proc.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, argv: list[str], envs: list[dict[str, str]], logs: list[Path], timeout: float,
            preload: str | None) -> dict | None:
        """The ranks' exit codes and why they failed; None where the zygote refused."""
        self.requests += 1
        request = {"id": self.requests, "argv": argv, "envs": envs, "cwd": str(REPO), "logs": [str(p) for p in logs],
                   "timeout": timeout, "preload": preload}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout + 120  # the zygote enforces the timeout; this is its own hang
        answer = self._reply(timeout + 120)
        while answer is not None and answer.get("id") != request["id"]:  # left by a test interrupted while waiting
            answer = self._reply(max(deadline - time.monotonic(), 0))
        if answer is None:
            self.proc.kill()
            raise RanksFailed(f"the rank zygote stopped answering (exit {self.proc.poll()})")
        return None if "refused" in answer else answer


@functools.cache
def zygote() -> Zygote | None:
    """This test process's zygote; None where it cannot start (ranks start fresh then)."""
    try:
        return Zygote()
    except (OSError, RuntimeError, ValueError):
        return None


def launch(what: str, argv: list[str], world: int, folder: Path, timeout: float, env: dict[str, str] | None,
           preload: str | None = None) -> None:
    """Run ``argv`` as ranks 0 .. world-1 (logs in ``folder``); return when all exit 0.  ``preload``:
    a module the ranks import, which the zygote imports before forking them."""
    base = rank_environment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
                             **(env or {})})
    envs = [{**base, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(world)]
    paths = [folder / f"rank{rank}.log" for rank in range(world)]
    forks = zygote()
    if argv[0] == sys.executable and forks is not None and forks.suits(base):
        answer = forks.run(argv[1:], envs, paths, timeout, preload)
        if answer is not None:
            if answer["why"]:
                raise RanksFailed(_report(what, world, paths, answer["returncodes"], answer["why"]))
            return
    procs = []
    try:
        for rank, path in enumerate(paths):
            with open(path, "w") as log:  # the rank holds its own descriptor
                procs.append(subprocess.Popen(argv, env=envs[rank], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                              start_new_session=True))
        why = watch(lambda r: procs[r].poll(), lambda r: _kill([procs[r]]), world, timeout)
        if why:
            raise RanksFailed(_report(what, world, paths, [p.returncode for p in procs], why))
    finally:
        _kill(procs)


def run_ranks(target: str, world: int, args: dict[str, Any] | None = None, timeout: float = 120,
              env: dict[str, str] | None = None) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="fp4quant-ranks-") as tmp:
        tmp = Path(tmp)
        torch.save(args or {}, tmp / "args.pt")
        code = CHILD.format(tests=str(TESTS), target=target, args=str(tmp / "args.pt"), out=str(tmp / "rank{rank}.pt"))
        launch(target, [sys.executable, "-c", code], world, tmp, timeout, env, preload=target.split(":")[0])
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


def _report(what, world, paths, returncodes, why) -> str:
    parts = [f"{what} on {world} ranks: {why}"]
    for r, path in enumerate(paths):
        parts.append(f"--- rank {r} (exit {returncodes[r]}) ---\n" + path.read_text(errors="replace")[-4000:])
    return "\n".join(parts)
