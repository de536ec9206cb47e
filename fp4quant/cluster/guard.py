"""Jobs that die with the process that started them (the runner), however the runner ends.

The runner holds the write end of a pipe, a :class:`Lifeline`; each job runs under a small
guard process that holds the read end:

    python guard.py --lifeline FD -- CMD...

When the runner exits -- normally, by an exception, or by SIGKILL, which gives it no chance
to clean up -- the kernel closes its end, the guard reads EOF and kills every process of the
job.  The guard is the job's subreaper (``PR_SET_CHILD_SUBREAPER``), so the job's processes
stay its descendants even when torchrun's workers start sessions of their own or their parent
dies first; and the job's first process gets ``PR_SET_PDEATHSIG(SIGKILL)``, so it dies at once
should the guard itself be killed.  A pipe, rather than a parent-death signal on the guard,
because that signal fires when the *thread* that started the guard ends, not the runner.

The guard runs by path, not as part of the package, so that it starts in milliseconds and
imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0  # after one node fails, the others get this long to end on their own


class Lifeline:
    """The runner's end of the pipe its guards watch; :meth:`cut` (or the runner's death) stops their jobs."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # not inherited by anything but the guards (pass_fds)

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` under a guard in a session of its own (so that it can be stopped as a group)."""
        guard = [sys.executable, "-I", os.path.abspath(__file__), "--lifeline", str(self.read_fd), "--", *cmd]
        return subprocess.Popen(guard, pass_fds=(self.read_fd,), start_new_session=True, **kwargs)

    def cut(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.read_fd = self.write_fd = -1


def stop(procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    """Stop guarded jobs: SIGTERM to each guard (it kills its job's processes), SIGKILL to the
    group of any guard still there after ``timeout``."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def wait_all(procs: list[subprocess.Popen], timeout: float | None = None) -> list[int | None]:
    """Wait for every job; return their exit codes, None for a job stopped because another
    failed first (a half-dead distributed job would otherwise wait forever).  Past
    ``timeout`` seconds, stop them all and raise TimeoutError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    stopped: set[int] = set()
    while any(p.poll() is None for p in procs):
        if deadline is not None and time.monotonic() > deadline:
            stop(procs)
            raise TimeoutError(f"the job ran past its timeout of {timeout:g} s and was stopped")
        if any(p.poll() not in (None, 0) for p in procs):
            end = time.monotonic() + GRACE_S
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            stopped = {i for i, p in enumerate(procs) if p.poll() is None}
            stop(procs)
            break
        time.sleep(0.1)
    return [None if i in stopped else p.wait() for i, p in enumerate(procs)]


# ---- the guard process -------------------------------------------------------------------


class _Stop(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(entry), fields[0]))
    found, todo = [], [root]
    while todo:
        for pid, state in children.get(todo.pop(), ()):
            todo.append(pid)
            if state != "Z":
                found.append(pid)
    return found


def _reap(job: int, status: list[int]) -> None:
    """Collect every exited child (orphans of the job come to us as its subreaper)."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == job:
            status.append(code)


def _kill_tree(job: int, status: list[int]) -> None:
    me = os.getpid()
    for _ in range(200):  # processes forked while we kill are found on the next pass
        pids = _descendants(me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
        _reap(job, status)
    _reap(job, status)


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def guard(lifeline: int, cmd: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.set_inheritable(lifeline, False)  # the job must not hold it

    def on_signal(signum, frame):
        raise _Stop(128 + signum)

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in handled:
        signal.signal(sig, on_signal)
    me = os.getpid()
    job = os.fork()
    if job == 0:
        try:
            for sig in handled:
                signal.signal(sig, signal.SIG_DFL)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != me:  # the guard died before prctl took effect
                os._exit(137)
            os.execvp(cmd[0], cmd)
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the guard
            print(f"guard: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
        os._exit(127)
    status: list[int] = []
    try:
        while not status:
            readable, _, _ = select.select([lifeline], [], [], 0.1)
            if readable and os.read(lifeline, 1) == b"":
                raise _Stop(128 + signal.SIGKILL)  # the runner is gone
            _reap(job, status)
    except _Stop as stop_:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        _kill_tree(job, status)
        return stop_.code
    _kill_tree(job, status)  # whatever the job left running
    return _exit_code(status[0])


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lifeline" or argv[2] != "--":
        print("usage: guard.py --lifeline FD -- CMD...", file=sys.stderr)
        return 2
    return guard(int(argv[1]), argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
