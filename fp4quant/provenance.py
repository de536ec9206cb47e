"""Provenance of results (commit, versions, hardware) and atomic writes.

Every result file the project writes goes through ``atomic_write_*``: the content
is written to a temporary file in the same folder, flushed, then renamed over the
target, so a reader (or a rerun after a crash) never sees half a file.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import platform
import secrets
import socket
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
# The source a training run executes (tests/test_provenance.py holds fp4quant.train's imports to
# it): the layers up to train, the data, the base modules, the C++/CUDA sources and their build
# (setup.py and the toolchain module it loads); of these folders, their code files only.
# A change elsewhere (analysis, bench, perfmodel, cluster, integrations, the environment table,
# docs, workflow, a README beside the code) leaves a run's numbers as they were, so a study may
# gather its runs over several commits (code_digest).
TRAINING_SOURCES = ("fp4quant/__init__.py", "fp4quant/provenance.py", "fp4quant/threads.py", "fp4quant/format",
                    "fp4quant/reference", "fp4quant/ops", "fp4quant/comm", "fp4quant/parallel", "fp4quant/models",
                    "fp4quant/data", "fp4quant/train", "csrc", "setup.py", "fp4quant/toolchain.py")
CODE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")


def _git(*args: str) -> bytes:
    # --no-optional-locks: reading provenance never writes the index (others may be using it)
    return subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True,
                          timeout=10, check=True).stdout


def uncommitted_digest() -> str | None:
    """A digest of the source tree's uncommitted state: every path that differs from HEAD (tracked
    files changed, added or deleted, untracked files git does not ignore) with its content and
    executable bit; None for a clean tree.  Content, not `git diff`'s text, so that it does not
    depend on the diff's configuration: the same edit gives the same digest on any machine."""
    status = _git("status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--ignore-submodules=none")
    paths = sorted({entry[3:] for entry in status.split(b"\0") if entry})
    if not paths:
        return None
    top = Path(_git("rev-parse", "--show-toplevel").decode().strip())  # porcelain paths are relative to it
    digest = hashlib.sha256()
    for rel in paths:
        digest.update(rel + b"\0" + _state(top / os.fsdecode(rel)) + b"\0")
    return digest.hexdigest()[:16]


def _state(path: Path) -> bytes:
    """What git would record of ``path``: a file's executable bit and content, a link's target."""
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            return b"link " + os.fsencode(os.readlink(path))
        if not stat.S_ISREG(st.st_mode):
            return b"folder"  # a submodule (its own commit is not followed)
        content = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                content.update(block)
        return (b"x " if st.st_mode & 0o100 else b"f ") + content.hexdigest().encode()
    except FileNotFoundError:
        return b"deleted"
    except OSError as exc:  # unreadable: still a state of its own, never a failure of provenance
        return f"unreadable {exc.errno}".encode()


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the source tree, or 'unknown' outside git (FP4QUANT_COMMIT if set).  A tree
    with uncommitted changes is '<commit>+dirty.<digest>' (uncommitted_digest): two different
    edits of the same commit are two provenances; the '+dirty' prefix is kept for readers of
    the old '<commit>+dirty'."""
    try:
        commit = _git("rev-parse", "HEAD").decode().strip()
        dirty = uncommitted_digest()
        return commit + (f"+dirty.{dirty}" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FP4QUANT_COMMIT", "unknown")


def _blob_line(rel: str, path: Path) -> str | None:
    """``git ls-tree``'s "mode blob-sha1 path" of a working file (None if it is gone), computed as
    git computes it, so that a clean tree's digest equals its commit's."""
    try:
        st = path.lstat()
        data = os.readlink(path).encode() if stat.S_ISLNK(st.st_mode) else path.read_bytes()
    except FileNotFoundError:
        return None
    mode = "120000" if stat.S_ISLNK(st.st_mode) else ("100755" if st.st_mode & 0o100 else "100644")
    return f"{mode} {hashlib.sha1(b'blob %d' % len(data) + bytes(1) + data).hexdigest()}\t{rel}"


def code_digest(commit: str | None = None, root: Path = REPO_ROOT) -> str:
    """A digest of the training code (TRAINING_SOURCES' code files): of the working tree (tracked and
    untracked files git does not ignore, as they are on disk), or of ``commit``.  Two trees whose
    training code is the same file for file have one digest, whatever else differs; 'unknown'
    outside git (FP4QUANT_CODE if set)."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, timeout=30,
                              check=True).stdout
    try:
        if commit is not None:
            lines = [line.replace(" blob ", " ", 1) for line in
                     git("ls-tree", "-r", "--full-tree", commit, "--", *TRAINING_SOURCES).decode().splitlines()
                     if line.endswith(CODE_SUFFIXES)]
        else:
            files = sorted({f for f in git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                                           *TRAINING_SOURCES).decode().split("\0") if f.endswith(CODE_SUFFIXES)})
            lines = [line for line in (_blob_line(f, root / f) for f in files) if line is not None]
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FP4QUANT_CODE", "unknown")
    return hashlib.sha256("\n".join(sorted(lines, key=lambda line: line.split("\t", 1)[1])).encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def _working_code_digest() -> str:
    return code_digest()


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
        "code": _working_code_digest(),  # the training code's digest: equal across commits that leave it as it was
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
    # Created by os.open with mode 0o666, as open(path, "w") creates a file: the kernel applies
    # the umask (or a folder's default ACL), so the result has the permissions any other file
    # written here would have -- unlike mkstemp's 0600, and with no umask read and restored.
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
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
