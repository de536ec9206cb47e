"""Provenance of results (commit, versions, hardware) and atomic writes.

Every result file the project writes goes through ``atomic_write_*``: the content
is written to a temporary file in the same folder, flushed, then renamed over the
target, so a reader (or a rerun after a crash) never sees half a file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the source tree ('+dirty' when it has uncommitted changes), or 'unknown'."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FP4QUANT_COMMIT", "unknown")


@lru_cache(maxsize=1)
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware(device: str | torch.device | None = None) -> str:
    """A one-line description of the hardware a result was measured on."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({torch.cuda.device_count()} visible)"
    return f"{cpu_model()}, {os.cpu_count()} cores (CPU)"


def provenance(device: str | torch.device | None = None, **extra: Any) -> dict[str, Any]:
    """What produced a result: commit, versions, hardware, time, plus ``extra`` (configuration)."""
    from . import __version__

    info: dict[str, Any] = {
        "fp4quant": __version__,
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "hardware": hardware(device),
        "host": socket.gethostname(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    info.update(extra)
    return info


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be read
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write dict rows as CSV (columns: union of keys, first-seen order)."""
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buf.getvalue())
