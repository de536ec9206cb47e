"""The rank zygote of tests/distributed.py: a process that imports torch and fp4quant once and
forks the ranks of the multi-process tests from there, so that a rank starts in milliseconds
instead of re-importing torch, DTensor and dynamo (about 2.7 s of CPU a rank on a 2-core VM).

It runs with OMP_NUM_THREADS=1 (as every rank does) and forks only while it is single-threaded.
A child becomes what a fresh ``python -c CODE``, ``python -m MODULE ARGS`` or ``python SCRIPT
ARGS`` would be: its own session, its output in a log, the environment it was asked for, its
generators seeded from the OS.

Protocol, one JSON object a line: stdin takes
    {"id": n, "argv": [...], "envs": [rank 0's environment, ...], "cwd": ..., "logs": [...], "timeout": s,
     "preload": module or null}
and stdout answers {"id": the request's, "returncodes": [...], "why": null | "a rank failed" |
"timed out after N s"}, or {"id": ..., "refused": why} when it cannot fork safely (the caller then
starts fresh processes).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import random
import runpy
import signal
import sys
import traceback

from rank_watch import watch  # beside this file, on sys.path as the script's folder

PRELOAD = ["torch", "torch.distributed", "fp4quant", "fp4quant.comm", "fp4quant.parallel", "fp4quant.train"]


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def child(argv: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    code = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # a fresh process's generators are seeded from the OS, each its own: so are the forks'
        random.seed()
        import torch

        torch.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = cwd
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        if argv[0] != "-c":  # as the interpreter's exit would (the -c rank body ends in os._exit itself)
            atexit._run_exitfuncs()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):  # killpg: the rank and what it started; kill: before its setsid
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(req: dict) -> dict:
    pids = []
    for env, log in zip(req["envs"], req["logs"]):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(req["argv"], env, req["cwd"], log)
        pids.append(pid)
    codes: dict[int, int] = {}

    def poll(r: int) -> int | None:
        if pids[r] not in codes:
            done, status = os.waitpid(pids[r], os.WNOHANG)
            if done:
                codes[pids[r]] = os.waitstatus_to_exitcode(status)
        return codes.get(pids[r])

    def kill(r: int) -> None:
        if pids[r] not in codes:
            _kill(pids[r])
            codes[pids[r]] = os.waitstatus_to_exitcode(os.waitpid(pids[r], 0)[1])

    why = watch(poll, kill, len(pids), req["timeout"])
    return {"returncodes": [codes[p] for p in pids], "why": why}


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        answer = None
        if req.get("preload"):
            try:
                importlib.import_module(req["preload"])
            except Exception as exc:  # the fresh process will show the error in full
                answer = {"refused": f"cannot import {req['preload']}: {type(exc).__name__}: {exc}"}
        running = threads()
        if answer is None and running > 1:
            answer = {"refused": f"{running} threads are running: a fork would copy their locks"}
        print(json.dumps({"id": req.get("id"), **(answer or run(req))}), file=reply, flush=True)


if __name__ == "__main__":
    main()
