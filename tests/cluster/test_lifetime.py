"""A job dies with its runner, even one killed by SIGKILL; cleanup touches only dead owners' namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _netns_helpers import kill, leftovers, needs_cluster, running, wait_for

from fp4quant.cluster import cleanup_stale

# each rank records its process id, then works forever
JOB = "import os, sys, time\n" \
      "open(os.path.join(sys.argv[1], 'pid' + os.environ['RANK']), 'w').write(str(os.getpid()))\n" \
      "while True:\n    time.sleep(0.1)\n"


def start_runner(tmp_path, nodes: int, env: dict[str, str]) -> tuple[subprocess.Popen, list[int]]:
    """`python -m fp4quant.cluster run` with the job above on ``nodes`` nodes; its ranks' pids once all run."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    runner = subprocess.Popen([sys.executable, "-m", "fp4quant.cluster", "run", "--rate-mbit", "100",
                               "--nodes", str(nodes), "--port", "29651", "--", str(job), str(tmp_path)],
                              env={**os.environ, **env}, stderr=subprocess.DEVNULL)
    files = [tmp_path / f"pid{r}" for r in range(nodes)]
    try:
        wait_for(lambda: all(f.exists() and f.read_text() for f in files), 120, "every rank to start")
    except AssertionError:
        kill(runner)
        raise
    return runner, [int(f.read_text()) for f in files]


@needs_cluster
def test_sigkill_of_the_runner_kills_its_job_and_cleanup_removes_its_namespaces(tmp_path):
    runner, ranks = start_runner(tmp_path, 2, {})
    tag = str(runner.pid)
    assert leftovers(tag)
    kill(runner)  # no handler runs, nothing in the runner cleans up
    wait_for(lambda: not any(running(p) for p in ranks), 10, f"ranks {ranks} to die with their runner")
    assert any(tag in name for name in cleanup_stale())
    assert leftovers(tag) == []


def test_sigkill_of_the_runner_kills_its_job_on_loopback_too(tmp_path):
    runner, ranks = start_runner(tmp_path, 2, {"FP4QUANT_NO_CLUSTER": "1"})
    kill(runner)
    wait_for(lambda: not any(running(p) for p in ranks), 10, f"ranks {ranks} to die with their runner")


@needs_cluster
def test_cleanup_leaves_a_live_emulation_alone(tmp_path):
    marker = tmp_path / "ready"
    script = textwrap.dedent(f"""
        import time
        from fp4quant.cluster import EmulatedCluster, LinkSpec
        with EmulatedCluster(2, LinkSpec(50e6)) as c:
            p = c.popen(1, ["sleep", "1000"])
            open({str(marker)!r}, "w").write(str(p.pid))
            time.sleep(1000)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script])
    try:
        guard = int(wait_for(lambda: marker.exists() and marker.read_text(), 60, "the emulation to start"))
        before = leftovers(str(owner.pid))
        assert len(before) >= 4
        assert not any(str(owner.pid) in name for name in cleanup_stale())
        assert leftovers(str(owner.pid)) == before
        assert running(guard) and owner.poll() is None
    finally:
        owner.terminate()
        owner.wait(timeout=60)
    assert leftovers(str(owner.pid)) == []


def test_the_owner_of_a_name_is_the_process_id_in_it():
    from fp4quant.cluster.netns import stale_owner

    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"fq{dead.pid}n0", f"fq{dead.pid}h1", f"fq{dead.pid}br", f"fqprobe{dead.pid}", f"fqnem{dead.pid}"):
        assert stale_owner(name), name
    for name in (f"fq{os.getpid()}n0", f"fq{os.getpid()}br", "fq0", "eth0", f"fq{dead.pid}x"):
        assert not stale_owner(name), name


@pytest.mark.parametrize("args, message", [
    (["--rate-mbit", "-5"], "--rate-mbit must be a positive number, got -5"),
    (["--rate-mbit", "inf"], "--rate-mbit must be a positive number, got inf"),
    (["--latency-ms", "-1"], "--latency-ms must be >= 0, got -1"),
    (["--nproc-per-node", "0"], "--nproc-per-node must be >= 1, got 0"),
    (["--nodes", "0"], "--nodes must be in 1..250, got 0"),
    (["--timeout", "-3"], "--timeout must be > 0 seconds, got -3"),
    (["--calibration", "/nonexistent/cal.json"], "--calibration /nonexistent/cal.json: No such file or directory"),
])
def test_bad_run_arguments_are_one_line_errors(args, message, capfd):
    from fp4quant.cluster.__main__ import main

    assert main(["run", *args, "--", "job.py"]) == 2
    err = capfd.readouterr().err
    assert err == f"fp4quant.cluster: error: {message}\n"


@pytest.mark.parametrize("emulated", [pytest.param(True, marks=needs_cluster), False])
def test_an_expired_timeout_stops_the_job_with_a_message(emulated, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {**os.environ} if emulated else {**os.environ, "FP4QUANT_NO_CLUSTER": "1"}
    r = subprocess.run([sys.executable, "-m", "fp4quant.cluster", "run", "--nodes", "2", "--timeout", "4",
                        "--port", "29652", "--record", str(tmp_path / "record.json"), "--", str(job), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 124
    assert json.loads((tmp_path / "record.json").read_text())["emulated"] is emulated  # kept though the job was stopped
    assert r.stderr.splitlines()[-1] == \
        "fp4quant.cluster: error: --timeout: the job ran past its timeout of 4 s and was stopped"
    ranks = [int(f.read_text()) for f in tmp_path.glob("pid*") if f.read_text()]
    assert not any(running(p) for p in ranks)


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "calibrate: unknown model 'nope'"),
    (["--tp", "3"], "calibrate: tensor-parallel size 3 does not divide"),
    (["--tp", "0"], "calibrate: --tp 0, --seq-len 128, --batch-size 2: each at least 1"),
    (["--presets", "fp4quant", "nope"], "calibrate: unknown preset 'nope'"),
])
def test_bad_calibrate_arguments_are_one_line_before_measuring(args, message, capsys, tmp_path):
    from fp4quant.cluster.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--out", str(tmp_path / "cal.json"), *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "cal.json").exists()
