"""scripts/gpu_check.sh (the one-GPU acceptance run) and its report, as far as a CPU machine can check them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from _build_support import ROOT, clean_env, copy_sources

MiB = 1 << 20


def test_gpu_check_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", "-x", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_gpu_check_records_timeouts_and_skips_and_still_reports(tmp_path):
    """With a budget too small for the build: the build is cut (timed out), the stages after it are
    recorded as skipped, the report runs, the exit status is 1.  The build here never ends (a
    setup.py that sleeps), so it is cut at the deadline however long the machine stage took."""
    (tmp_path / "src").mkdir()
    src = copy_sources(tmp_path / "src")
    (src / "setup.py").write_text("import time\ntime.sleep(3600)\n")
    shutil.copytree(ROOT / "scripts", src / "scripts")
    results = tmp_path / "results"
    proc = subprocess.run(["bash", str(src / "scripts" / "gpu_check.sh"), str(results)], capture_output=True,
                          text=True, timeout=300, env=clean_env(GPU_CHECK_BUDGET="40", PYTHON=sys.executable))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stages = pd.read_csv(results / "stages.tsv", sep="\t").set_index("stage").status.to_dict()
    assert stages["machine"] == "ok" and stages["build"] == "failed(124)", stages
    assert {s for s, status in stages.items() if status == "skipped"} >= {"info", "tests_cuda", "bench", "train_tp1_bf16"}
    assert stages["report"] == "ok", stages
    summary = (results / "summary.txt").read_text()
    assert "-- build: FAILED (exit 124, timed out)" in summary and "SKIPPED, the time budget is spent" in summary
    assert json.loads((results / "provenance.json").read_text())["script"] == "scripts/gpu_check.sh"
    assert json.loads((results / "report.json").read_text())["missing"] == ["kernels_cuda.csv", "projection_gpu.csv"]


def test_report_puts_each_kernel_beside_the_copy_of_the_same_bytes(tmp_path):
    rows = [("clone", "torch", "", 64 * MiB, 2000.0), ("quantize", "native", "fp4quant", 64 * MiB, 1500.0),
            ("quantize", "native", "naive_pack", 64 * MiB, 1000.0), ("dequantize", "native", "fp4quant", 64 * MiB, 500.0),
            ("quantize", "reference", "fp4quant", 64 * MiB, 10.0), ("clone", "torch", "", MiB, 400.0),
            ("quantize", "native", "fp4quant", MiB, 300.0), ("quantize", "native", "naive_pack", MiB, 300.0)]
    pd.DataFrame([dict(op=o, impl=i, preset=p, size_bytes=s, gbps=g, device="cuda") for o, i, p, s, g in rows]).to_csv(
        tmp_path / "kernels_cuda.csv", index=False)
    (tmp_path / "train_tp2").mkdir()
    (tmp_path / "train_tp2" / "summary.json").write_text(json.dumps({
        "provenance": {"config": {"comm": "fp4quant"}}, "mesh": {"tp": 2, "backend": "gloo", "device": "cuda"},
        "final_loss": 2.5, "val_loss": 2.6, "tokens_per_s": 1e5}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    fractions = {(r["op"], r["preset"], r["size_bytes"]): r["fraction_of_copy"] for r in report["kernels"]}
    assert fractions == {("quantize", "fp4quant", 64 * MiB): 0.75, ("quantize", "naive_pack", 64 * MiB): 0.5,
                         ("dequantize", "fp4quant", 64 * MiB): 0.25, ("quantize", "fp4quant", MiB): 0.75,
                         ("quantize", "naive_pack", MiB): 0.75}
    assert [(p["size_bytes"], p["warp_over_naive"]) for p in report["packing"]] == [(MiB, 1.0), (64 * MiB, 1.5)]
    assert report["training"][0]["final_loss"] == 2.5 and report["missing"] == ["projection_gpu.csv"]
    assert "| quantize | fp4quant | 1.5e+03 | 2e+03 | 0.75 |" in (tmp_path / "report.md").read_text()
