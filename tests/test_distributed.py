"""The multi-process tests' launcher (tests/distributed.py): ranks forked from the zygote are
the fresh processes they stand for, and a failed or hung rank fails the test in seconds."""

from __future__ import annotations

import json
import os
import time

import pytest

from distributed import REPO, RanksFailed, run_ranks, zygote


def test_forked_ranks_are_what_fresh_processes_would_be():
    forks = zygote()
    assert forks is not None, "the rank zygote did not start"
    ranks = run_ranks("launcher_jobs:identity", 2)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert {r["parent"] for r in ranks} == {forks.proc.pid}  # forked, not started fresh
    # as fresh processes: torch seeded from the OS, each rank its own seed, one thread
    again = run_ranks("launcher_jobs:identity", 2)
    seeds = [r["seed"] for r in ranks + again]
    assert len(set(seeds)) == 4 and len({tuple(r["draw"]) for r in ranks + again}) == 4
    assert {r["threads"] for r in ranks} == {1} and ranks[0]["argv0"] == "-c"


def test_ranks_start_fresh_where_their_environment_differs_from_the_zygotes():
    ranks = run_ranks("launcher_jobs:identity", 2, env={"FP4QUANT_BACKEND": "reference"})  # read at import
    assert {r["parent"] for r in ranks} == {os.getpid()}
    assert {r["backend"] for r in ranks} == {"reference"}


@pytest.mark.parametrize("env", [None, {"FP4QUANT_BACKEND": "reference"}], ids=["forked", "fresh"])
def test_a_failed_rank_fails_the_job_at_once_with_its_traceback(env):
    start = time.monotonic()
    with pytest.raises(RanksFailed) as failed:
        run_ranks("launcher_jobs:fail_on_rank_one", 2, timeout=120, env=env)
    assert time.monotonic() - start < 30  # not rank 0's 60 s sleep, nor the timeout
    message = str(failed.value)
    assert message.startswith("launcher_jobs:fail_on_rank_one on 2 ranks: a rank failed")
    assert "ValueError: rank one says no" in message and "--- rank 1 (exit 1) ---" in message


@pytest.mark.parametrize("env", [None, {"FP4QUANT_BACKEND": "reference"}], ids=["forked", "fresh"])
def test_a_hung_rank_is_killed_at_the_timeout(env):
    start = time.monotonic()
    with pytest.raises(RanksFailed, match="timed out after 8 s"):
        run_ranks("launcher_jobs:hang", 2, timeout=8, env=env)
    assert time.monotonic() - start < 40


def test_an_answer_left_unread_by_an_interrupted_test_is_skipped(tmp_path):
    forks = zygote()
    forks.requests += 1  # a request whose test was interrupted before it read the answer
    stale = {"id": forks.requests, "argv": ["-c", "import time; time.sleep(1)"], "envs": [forks.env],
             "cwd": str(REPO), "logs": [str(tmp_path / "stale.log")], "timeout": 30, "preload": None}
    forks.proc.stdin.write(json.dumps(stale).encode() + b"\n")
    forks.proc.stdin.flush()
    ranks = run_ranks("launcher_jobs:identity", 2)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["parent"] for r in ranks} == {forks.proc.pid}
