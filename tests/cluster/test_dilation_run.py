"""The emulated cluster dilates every component by the calibration's factor: the link's rate,
its latency (slept per wire step where netem cannot shape it), the codec, the token bucket;
the calibration and the run record carry them, and the record the latency measured inside."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest

from _netns_helpers import needs_cluster

from fp4quant.cluster.__main__ import main as cluster_main, rank_job, run_dilation
from fp4quant.cluster.calibrate import TargetCluster
from fp4quant.cluster.dilation import Dilation
from fp4quant.cluster.netns import LinkSpec
from fp4quant.cluster.rank import variables

calibrate_module = importlib.import_module("fp4quant.cluster.calibrate")  # the package exports its function


def test_the_calibration_dilates_latency_codec_and_burst_by_the_same_factor(monkeypatch):
    monkeypatch.setattr(calibrate_module, "measure_training_flops", lambda *a, **k: 6e10)
    monkeypatch.setattr(calibrate_module, "measure_codec", lambda *a, **k: {})
    d = calibrate_module.calibrate("tiny", 128, 2, 2, []).to_dict()
    t = TargetCluster()
    dilation = t.flops_per_gpu / 6e10
    assert d["time_dilation"] == pytest.approx(dilation)
    assert d["link_rate_bps"] == pytest.approx(8 * t.inter_node_bw / dilation)
    assert d["link_latency_s"] == pytest.approx(t.inter_node_latency * dilation)
    assert d["codec_bytes_per_s"] == pytest.approx(t.codec_hbm_fraction * t.hbm_bw / dilation)
    assert d["codec_target_value_bytes"] == 2 and d["target"]["codec_hbm_fraction"] == 0.7
    assert d["link_burst_bytes"] == LinkSpec(d["link_rate_bps"]).burst_bytes
    assert d["link_burst_s"] == pytest.approx(1 / 250, rel=1e-3)
    assert d["link_burst_target_s"] == pytest.approx(d["link_burst_s"] / dilation)


def _args(**kw):
    return SimpleNamespace(**{"link_only": False, "codec_bps": None, "calibration": "cal.json", **kw})


def test_the_runner_injects_the_latency_netem_did_not_shape_and_the_codec_stretch():
    link, cal = LinkSpec(60e6, 0.0665), {"codec_bytes_per_s": 3.5e8}
    assert run_dilation(_args(), cal, link, latency_shaped=False) == Dilation(0.0665, 3.5e8)
    assert run_dilation(_args(), cal, link, latency_shaped=True) == Dilation(0.0, 3.5e8)
    assert run_dilation(_args(codec_bps=1e6), cal, link, False) == Dilation(0.0665, 1e6)
    assert run_dilation(_args(), None, link, False) == Dilation(0.0665, 0.0)  # --latency-ms alone
    assert run_dilation(_args(link_only=True), cal, link, False) == Dilation()
    env = variables(Dilation(0.0665, 3.5e8))
    assert float(env["FP4QUANT_CLUSTER_LATENCY_S"]) == 0.0665 and float(env["FP4QUANT_CLUSTER_CODEC_BPS"]) == 3.5e8
    assert rank_job(["-m", "fp4quant.train", "--tp", "2"]) == ["-m", "fp4quant.cluster.rank", "-m", "fp4quant.train",
                                                               "--tp", "2"]


@pytest.mark.parametrize("how", ["module", "script"])
def test_a_rank_runs_its_job_with_the_dilation_installed(tmp_path, how):
    """The job (here a script or a module printing what the collectives' hooks are) knows
    nothing of the emulation: the rank wrapper installs it from the runner's variables."""
    import os
    import subprocess
    import sys

    (tmp_path / "job.py").write_text("import sys, fp4quant.comm as comm\n"
                                     "print(comm.hooks.describe(), sys.argv[1:])\n")
    job = [str(tmp_path / "job.py"), "a"] if how == "script" else ["-m", "job", "a"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           **variables(Dilation(0.25, 1e6))}
    out = subprocess.run([sys.executable, "-m", "fp4quant.cluster.rank", *job], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'latency_s': 0.25" in out.stdout and "'codec_bytes_per_s': 1000000.0" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("['a']"), out.stdout
    plain = subprocess.run([sys.executable, "-m", "fp4quant.cluster.rank", *job],
                           env={k: v for k, v in env.items() if not k.startswith("FP4QUANT_CLUSTER_")},
                           capture_output=True, text=True, timeout=120)
    assert plain.stdout.startswith("None"), plain.stdout


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_codec_rate_is_refused_in_one_line(value, capfd):
    assert cluster_main(["run", "--codec-bps", value, "--", "job.py"]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("fp4quant.cluster: error: --codec-bps must be") and "\n" not in err


def test_a_bad_calibration_codec_rate_is_refused_in_one_line(tmp_path, capfd, monkeypatch):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"link_rate_bps": 6e7, "link_latency_s": 0.01, "codec_bytes_per_s": -5}))
    monkeypatch.setattr("fp4quant.cluster.__main__.unavailable_reason", lambda: None)
    monkeypatch.setattr("fp4quant.cluster.__main__.cleanup_stale", lambda: [])

    class Cluster:  # the codec rate is checked once the cluster says whether netem shaped the latency
        latency_shaped = False

        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr("fp4quant.cluster.__main__.EmulatedCluster", Cluster)
    assert cluster_main(["run", "--calibration", str(cal), "--", "job.py"]) == 2
    err = capfd.readouterr().err.strip()
    assert "codec_bytes_per_s must be a finite number >= 0" in err and "\n" not in err


JOB = """import json, os, sys, torch.distributed as d
d.init_process_group('gloo'); d.barrier()
if d.get_rank() == 0:
    json.dump({k: os.environ.get(k) for k in ('FP4QUANT_CLUSTER_LATENCY_S', 'FP4QUANT_CLUSTER_CODEC_BPS')},
              open(sys.argv[1], 'w'))
d.barrier(); os._exit(0)
"""


@needs_cluster
def test_a_run_passes_the_dilation_to_the_ranks_and_records_the_latency_measured(tmp_path):
    latency = 0.02
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"link_rate_bps": 100e6, "link_latency_s": latency, "codec_bytes_per_s": 3.5e8,
                               "time_dilation": 2000.0}))
    job, seen, record = tmp_path / "job.py", tmp_path / "seen.json", tmp_path / "rec.json"
    job.write_text(JOB)
    code = cluster_main(["run", "--calibration", str(cal), "--record", str(record), "--timeout", "400", "--",
                         str(job), str(seen)])
    assert code == 0
    rec = json.loads(record.read_text())
    d = rec["dilation"]
    injected = 0.0 if rec["latency_shaped"] else latency
    assert d["latency_injected_s"] == injected and d["codec_bytes_per_s"] == 3.5e8 and d["time_dilation"] == 2000.0
    assert d["link_burst_bytes"] == LinkSpec(100e6).burst_bytes == rec["link_burst_bytes"]
    assert json.loads(seen.read_text()) == {"FP4QUANT_CLUSTER_LATENCY_S": repr(injected),
                                            "FP4QUANT_CLUSTER_CODEC_BPS": repr(3.5e8)}
    probe = rec["measured_latency_s"]
    assert "failed" not in probe, probe
    assert probe["bytes"] == 4096 and probe["iterations"] >= 5 and probe["world"] == 2
    assert probe["wire_steps_slept"] == 2 * probe["iterations"]  # a ring of 2: 2 steps per all-reduce
    for series in ("plain", "dilated"):
        p = probe[series]
        assert 0 < p["min_s"] <= p["median_s"] <= p["max_s"]
    # a sleep never ends early: each dilated all-reduce lasts at least its 2 injected latencies
    assert probe["dilated"]["min_s"] >= 2 * injected
    assert probe["expected_added_s"] == pytest.approx(2 * injected)


@needs_cluster
def test_a_run_without_added_latency_records_why_it_did_not_probe_it(tmp_path):
    job, seen, record = tmp_path / "job.py", tmp_path / "seen.json", tmp_path / "rec.json"
    job.write_text(JOB)
    code = cluster_main(["run", "--rate-mbit", "100", "--record", str(record), "--timeout", "400", "--",
                         str(job), str(seen)])
    assert code == 0
    rec = json.loads(record.read_text())
    assert rec["dilation"]["latency_injected_s"] == 0.0 and rec["link_latency_ms"] == 0.0
    assert rec["measured_latency_s"] == {"skipped": "no latency added (neither injected nor shaped)"}
