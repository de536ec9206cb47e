"""What the cluster tests share: the skip marker and the names an emulation leaves behind."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from fp4quant.cluster import unavailable_reason

REASON = unavailable_reason()
needs_cluster = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster unavailable here: {REASON}")


def leftovers(tag: str) -> list[str]:
    """The namespaces and links of the emulation owned by process ``tag`` that still exist."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (ns + links).splitlines() if re.search(rf"\bfq{tag}(n\d+|h\d+|br)\b", line)]


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL (no handler runs) and reap."""
    os.kill(proc.pid, 9)
    proc.wait()
