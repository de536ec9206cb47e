"""The Snakemake workflow: dry runs of every target, and the whole pipeline at CI scale."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fp4quant.analysis.tables import number

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


def table_rows(tex: Path, block: int = 0) -> list[list[str]]:
    """The body rows of a table's ``block``-th tabular."""
    body = tex.read_text().split("\\begin{tabular}")[1 + block].split("\\hline")[2]
    return [[c.strip().replace("\\_", "_") for c in line.rstrip("\\ ").split("&")]
            for line in body.strip().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # above snakemake's own 1500 s, which reports the log's tail
def test_whole_pipeline_at_ci_scale(tmp_path):
    r = snakemake("--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in FIGURES:
        pdf = tmp_path / "figures" / f"{name}.pdf"
        assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5000
        assert b"/Type3" not in pdf.read_bytes(), f"{name}.pdf embeds a Type 3 font"  # venues refuse them
    results = tmp_path / "data" / "ci" / "results"
    validation = pd.read_csv(results / "model_validation.csv")
    assert {"config", "component", "measured_s", "predicted_s", "rel_error"} <= set(validation.columns)
    assert {"compute", "codec", "communication", "total"} <= set(validation.component)
    assert (tmp_path / "data" / "ci" / "tests" / "junit.xml").read_text().count("testcase") > 5
    # the emulated all-reduce at the largest size beside the speedup its components predict
    prediction = pd.read_csv(results / "allreduce_prediction.csv")
    assert set(prediction.size_bytes) == {1048576} and prediction.algorithm.iloc[0] == "uncompressed"
    assert (prediction.predicted_s > 0).all() and prediction.ratio_rel_error.notna().all()

    # the tables' numbers are the CSVs' numbers: losses from the training runs, tokens/s from the
    # throughput runs (on the emulated cluster, or loopback where it cannot be built)
    training = pd.read_csv(results / "training.csv").set_index("comm")
    throughput = pd.read_csv(results / "throughput.csv").set_index("comm")
    assert (throughput.steps == 2).all() and (throughput.seq_len == 128).all()
    assert set(throughput.run.str.split("/").str[2]) == {"cluster"}  # data/ci/cluster/throughput/...
    # two experiments, two blocks of the table: (a) the throughput runs, (b) the training runs
    speed = {r[0]: r for r in table_rows(tmp_path / "paper/tables/end_to_end.tex", 0)}
    losses = {r[0]: r for r in table_rows(tmp_path / "paper/tables/end_to_end.tex", 1)}
    assert set(speed) == set(throughput.index) and set(losses) == set(training.index)
    for comm, t in throughput.iterrows():  # one seed at CI scale: the mean alone
        assert speed[comm][1:] == ["1", number(t.tokens_per_s, ".1f"), number(t.speedup_vs_bf16, ".3f")]
    for comm, t in training.iterrows():
        assert losses[comm][1:4] == ["1", number(t.final_loss, ".4f"), number(t.val_loss, ".4f")]
    regime = pd.read_csv(results / "regime.csv")
    assert set(zip(regime.source, regime.comm)) >= {("projected", "bf16"), ("predicted", "fp4quant"),
                                                    ("measured", "bf16"), ("measured", "fp4quant")}
    tex = table_rows(tmp_path / "paper/tables/regime.tex")
    assert [r[5:] for r in tex] == [[number(100 * r[f"{c}_share"], ".0f") for c in ("compute", "codec", "bandwidth",
                                                                                  "latency")]
                                    for _, r in regime.iterrows()]
    error = pd.read_csv(results / "error.csv")
    presets = error[error.study == "presets"]
    for row in table_rows(tmp_path / "paper/tables/formats.tex"):
        g = presets[presets.config == row[0]].sort_values("kind")
        assert row[1] == number(g.bits_per_value.iloc[0], ".3f")
        assert row[3:] == [number(v, ".2f") for v in g.sqnr_db]
    ablation = pd.read_csv(results / "ablation.csv")
    tex = table_rows(tmp_path / "paper/tables/ablation.tex")
    assert len(tex) == len(ablation)
    for row, a in zip(tex, ablation.itertuples()):
        if a.change_unit == "identical bytes":  # naive_pack's training: fp4quant's bytes, no run
            assert a.ablation == "naive_pack" and row == [a.ablation, a.measure, "--", "--", "none (identical bytes)"]
            continue
        change = (number(a.change, "+.2f") + " dB" if a.change_unit == "dB"
                  else number(100 * a.change, "+.1f") + "\\%")
        low, high = getattr(a, "change_low", float("nan")), getattr(a, "change_high", float("nan"))
        if pd.notna(low):  # a kernel row: the range its slowest and fastest runs allow
            change += f" [{number(100 * low, '+.1f')}\\%, {number(100 * high, '+.1f')}\\%]"
        seeds, sd = getattr(a, "seeds", float("nan")), getattr(a, "fp4quant_seed_sd", float("nan"))
        if pd.notna(seeds):  # a training row: its seeds, beside fp4quant's own spread over its seeds
            noise = f"; fp4quant's seeds: SD {number(100 * sd, '.1f')}\\%" if pd.notna(sd) else ""
            change += f" ({int(seeds)} seed{'s' if seeds != 1 else ''}{noise})"
        assert a.change_unit == ("dB" if a.measure.startswith("sqnr_db/") else "relative")
        assert row == [a.ablation, a.measure, number(a.fp4quant, ".4g"), number(a.ablated, ".4g"), change]
    assert "nan" not in (tmp_path / "paper/tables/ablation.tex").read_text().replace("provenance", "")
    packing = pd.read_csv(results / "ablation_naive_pack.csv")  # the kernels of both packings, op by op
    assert set(packing.op) == {"quantize", "dequantize", "dequantize_reduce"} and packing.speed_over_naive.notna().all()
    assert not (results.parent / "runs/tiny/naive_pack").exists()

    # a rerun has nothing to do; removing one output redoes just what depends on it
    r = snakemake("-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path)
    assert "Nothing to be done" in r.stdout + r.stderr
    (tmp_path / "figures" / "error.pdf").unlink()
    r = snakemake("-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml"), cwd=tmp_path)
    assert "figure" in r.stdout and "train " not in r.stdout

    # results carry the commit that computed them: at another commit everything is computed again
    env = {**os.environ, "GIT_DIR": str(tmp_path / "no-git"), "FP4QUANT_COMMIT": "0" * 40}
    r = subprocess.run([*SNAKEMAKE, "-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/ci.yaml")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "Params have changed since last execution" in r.stdout
    for rule in ("build_extension", "prepare_data", "train", "cluster_train", "collect_results", "collect_throughput",
                 "regime", "figure", "table"):
        assert f"rule {rule}:" in r.stdout


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
