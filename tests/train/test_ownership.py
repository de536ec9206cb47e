"""A run folder has one owner: a second run on it is refused, and torchrun's workers die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from train.launch import cli, kill_tree, short, torchrun


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def long_run(data: str, out: Path, checkpoint_every: int = 5) -> subprocess.Popen:
    """A TP = 2 run under torchrun that takes minutes (stopped by the test)."""
    return torchrun(["--model", "tiny", "--tp", "2", "--steps", "100000", "--seq-len", "32", "--batch-size", "1",
                     "--checkpoint-every", str(checkpoint_every), "--data", data, "--out", str(out)],
                    stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_holder(data, tmp_path, capsys):
    out = tmp_path / "run"
    # no checkpoint while it runs: the TP = 1 rerun below must find no run of another configuration
    first = long_run(data, out, checkpoint_every=100000)
    try:
        wait_for(lambda: (out / "log.jsonl").exists() and (out / "log.jsonl").read_text(), 120, "the first run's steps")
        holder = json.loads((out / ".lock").read_text())
        status, err = cli(capsys, **short(data, out, seq_len=32, batch_size=1))
        assert status == 2 and len(err.splitlines()) == 1, err
        assert "is in use by another run" in err and f"process {holder['pid']}" in err, err
    finally:
        kill_tree(first.pid)
        first.wait()
    # its owner is gone (killed, not ended): the lock went with it, and a rerun takes the folder
    status, err = cli(capsys, **short(data, out, seq_len=32, batch_size=1, steps=6))
    assert status == 0, err


@pytest.mark.slow
def test_workers_die_with_a_killed_torchrun(data, tmp_path):
    """SIGKILL of torchrun alone (not its workers' sessions): the workers die within seconds
    instead of training on into the folder."""
    out = tmp_path / "run"
    launcher = long_run(data, out)
    workers: list[int] = []
    try:
        wait_for(lambda: (out / "log.jsonl").exists() and (out / "log.jsonl").read_text(), 120, "the run's steps")
        workers = children(launcher.pid)
        assert len(workers) == 2, workers
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        wait_for(lambda: not any(alive(w) for w in workers), 15, "the orphaned workers to die")
    finally:
        for pid in [launcher.pid, *workers]:
            kill_tree(pid)
        launcher.wait()
