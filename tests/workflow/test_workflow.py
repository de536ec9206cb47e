"""The Snakemake workflow: dry runs of every target, its checks and its launcher (the whole pipeline
at CI scale: test_whole_pipeline.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
FIGURES = ["throughput", "kernels", "allreduce", "convergence", "error", "traffic", "breakdown", "validation", "topology",
           "projection"]
TABLES = ["formats", "ablation", "end_to_end"]


def snakemake(*args, cwd, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "target", ["figures/throughput.pdf", "all", "ablation_no_fwht", "ablation_single_scale"]
)
@pytest.mark.parametrize("config", ["default", "h100"])
def test_dry_run(target, config, tmp_path):
    r = snakemake(target, "-n", "--cores", "2", "--configfile", str(REPO / f"workflow/config/{config}.yaml"),
                  cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "train" in out and "build_extension" in out
    if target == "all":
        # the emulated cluster's figures where it runs; on GPU nodes (h100.yaml) the nodes are measured instead
        emulated_only = {"projection", "validation"} if config == "h100" else set()
        for name in FIGURES:
            assert (f"figures/{name}.pdf" in out) != (name in emulated_only), name
        assert ("rule topology_benchmark:" in out) == (config == "h100")
        assert ("rule cluster_calibration:" in out) == (config == "default")
    if target.startswith("ablation_"):  # an ablation trains the full method and itself only
        comm = target.removeprefix("ablation_")
        assert re.search(rf"runs/[\w.-]+/{comm}/seed0/summary.json", out)
        assert "runs/tiny/bf16" not in out and "runs/qwen-7b/bf16" not in out


def test_the_naive_packing_ablation_reads_the_kernel_benchmark_and_trains_nothing(tmp_path):
    """naive_pack sends fp4quant's bytes: a kernel ablation, one step after the kernel benchmark."""
    r = snakemake("ablation_naive_pack", "-n", "--cores", "2", "--configfile",
                  str(REPO / "workflow/config/default.yaml"), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "rule ablation_naive_pack:" in out and "data/cpu/results/ablation_naive_pack.csv" in out
    assert "input: data/cpu/bench/kernels.csv\n" in out and "rule kernel_benchmark:" in out
    assert "rule train:" not in out and "naive_pack/seed" not in out


def test_loopback_overlay_trains_without_the_cluster(tmp_path):
    configs = [str(REPO / "workflow/config/default.yaml"), str(REPO / "workflow/config/loopback.yaml")]
    r = snakemake("all", "-n", "--cores", "2", "--configfile", *configs, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "data/cpu-loopback/runs/tiny/fp4quant/seed0/summary.json" in out and "cluster_train" not in out


def test_invalid_configuration_is_rejected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "workflow/config/ci.yaml").read_text().replace("tp: 2", "tp: zero"))
    r = snakemake("-n", "--cores", "1", "--configfile", str(bad), cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "tp" in (r.stdout + r.stderr)


def test_a_latency_run_with_the_validation_runs_own_bytes_is_rejected(tmp_path):
    ci = (REPO / "workflow/config/ci.yaml").read_text()
    bad = tmp_path / "echo.yaml"
    bad.write_text(ci.replace("    steps: 8\n", "    steps: 8\n    latency_batch_size: 2\n", 1))  # train.batch_size: 2
    assert bad.read_text() != ci
    r = snakemake("-n", "--cores", "1", "--configfile", str(bad), cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "latency_batch_size (2) must differ from train.batch_size" in r.stdout + r.stderr


def _load_launch():
    spec = importlib.util.spec_from_file_location("launch", REPO / "workflow/scripts/launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_launcher_shares_the_job_cores_among_ranks():
    launch = _load_launch()
    assert launch.rank_threads(2, {"OMP_NUM_THREADS": "2"})["OMP_NUM_THREADS"] == "1"
    assert launch.rank_threads(2, {"OMP_NUM_THREADS": "16"}) == dict.fromkeys(launch.THREAD_VARIABLES, "8")
    assert launch.rank_threads(8, {"OMP_NUM_THREADS": "4"})["MKL_NUM_THREADS"] == "1"  # never zero
    cores = len(os.sched_getaffinity(0))
    assert launch.rank_threads(1, {})["OMP_NUM_THREADS"] == str(cores)


def test_launched_ranks_see_their_share_of_threads(tmp_path):
    """Under Snakemake (OMP_NUM_THREADS = the rule's threads) each torchrun rank gets its share."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nrank = os.environ['LOCAL_RANK']\n"
                     "open(f'rank{rank}.txt', 'w').write(os.environ['OMP_NUM_THREADS'])\n")
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    r = subprocess.run([sys.executable, str(REPO / "workflow/scripts/launch.py"), "--kind", "torchrun",
                        "--nproc-per-node", "2", "--", str(probe)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(tmp_path / f"rank{i}.txt").read_text() for i in range(2)] == ["2", "2"]


def test_a_killed_launcher_takes_torchrun_and_its_ranks_with_it(tmp_path):
    """SIGKILL of launch.py alone: torchrun and both ranks stop within seconds, nothing keeps
    training into the run folder."""
    import signal
    import time

    probe = tmp_path / "probe.py"
    probe.write_text("import os, time\nrank = os.environ['LOCAL_RANK']\n"
                     "open(f'pid{rank}.txt', 'w').write(str(os.getpid()))\nwhile True:\n    time.sleep(0.1)\n")
    launcher = subprocess.Popen([sys.executable, str(REPO / "workflow/scripts/launch.py"), "--kind", "torchrun",
                                 "--nproc-per-node", "2", "--", str(probe)], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = [tmp_path / f"pid{r}.txt" for r in range(2)]
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
        time.sleep(0.1)
    ranks = [int(f.read_text()) for f in files]

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in ranks if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "ranks outlived their launcher"
