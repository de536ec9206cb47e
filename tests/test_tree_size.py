"""The repository stays small enough to travel: a machine that runs the project's checks (a GPU's
one-shot check among them) receives a copy of the working tree of at most 64 MiB, so the tracked
tree stays under 16 MiB, and reference/ keeps at most six frozen runs (older ones live in git's
history; `python -m fp4quant.analysis freeze` writes each in its slim layout)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 16 << 20
MOST_RUNS = 6


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def checkout() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (e.g. a copy of the working tree): nothing tracked to measure")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")


def committed_bytes() -> int | None:
    """The bytes of HEAD's tree (`git ls-tree -r -l HEAD`); None before the first commit."""
    listed = git("ls-tree", "-r", "-l", "-z", "HEAD")
    if listed.returncode != 0:
        return None
    sizes = [entry.split(b"\t", 1)[0].split()[3] for entry in listed.stdout.split(b"\0") if entry]
    return sum(int(s) for s in sizes if s != b"-")  # "-": a submodule's commit, no blob


def worktree_bytes() -> int:
    """The bytes of the files a commit of the working tree would hold (`git ls-files`: tracked and
    untracked files git does not ignore, as they are on disk; deleted ones count nothing)."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    assert listed.returncode == 0, listed.stderr.decode()
    paths = {REPO / p.decode() for p in listed.stdout.split(b"\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("tree", ["HEAD", "working tree"])
def test_the_tracked_tree_stays_under_16_mib(checkout, tree):
    size = committed_bytes() if tree == "HEAD" else worktree_bytes()
    if size is None:
        pytest.skip("no commit yet")
    assert size < LIMIT_BYTES, (
        f"the {tree}'s tracked files hold {size / 2**20:.1f} MiB, at or over {LIMIT_BYTES >> 20} MiB: keep raw logs "
        "packed (fp4quant.analysis.freeze.slim), drop superseded runs from reference/ and data/ (git keeps them)")


def test_reference_holds_at_most_six_runs():
    reference = REPO / "reference"
    if not reference.is_dir():
        pytest.skip("no reference/ here")
    runs = sorted(p.name for p in reference.iterdir() if p.is_dir())
    assert len(runs) <= MOST_RUNS, (f"reference/ holds {len(runs)} runs ({', '.join(runs)}): keep at most {MOST_RUNS}, "
                                    "the newest of each kind; git's history keeps the rest")
