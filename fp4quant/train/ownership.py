"""A run folder has one owner: one run at a time writes it, and its ranks die with their launcher.

``RunLock`` is an exclusive ``flock`` on ``<out>/.lock``, taken by global rank 0 before the
run reads or writes anything in the folder and held until the run ends; the kernel drops it
when the process dies, however it dies, so a lock is never stale.  A second run on the same
folder is refused in one line naming the holder (host, process id, start time), which the
owner writes into the file.

``die_with_launcher`` asks the kernel to kill a torchrun worker when its launcher (its parent
process) dies: ``kill -9`` of torchrun would otherwise leave the workers training into the
folder, beside any restart.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import fcntl
import json
import os
import signal
import socket
import sys
from pathlib import Path

LOCK_NAME = ".lock"
PR_SET_PDEATHSIG = 1


class RunLock:
    """The exclusive lock of one run folder (see the module's docstring)."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock: None, or why not (one line naming the holder)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            return f"{self.path.parent} is in use by another run ({holder}): wait for it to end, or choose another --out"
        holder = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # the folder's next owner finds no stale holder
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


def _describe(raw: bytes) -> str:
    try:
        holder = json.loads(raw)
        return f"process {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):  # written this instant, or by hand
        return "a process that has not yet said who it is"


def die_with_launcher() -> None:
    """Under torchrun: SIGKILL this worker when the launcher that started it dies (Linux; a
    no-op elsewhere).  torchrun starts its workers from its main thread, whose end is the
    process's: the parent-death signal fires exactly when torchrun is gone."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not permitted here: the lock still keeps a restart out of the folder
    if parent == 1 or os.getppid() != parent:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
