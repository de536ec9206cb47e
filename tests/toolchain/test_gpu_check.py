"""scripts/gpu_check.sh (the one-GPU acceptance run), its report and its helper scripts/gpu_ops.py,
as far as a CPU machine can check them: the dry run on a copy of what a fresh checkout holds,
the budget, the EXIT trap's packing into OUT, the report of a synthetic results folder."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

from _build_support import ROOT, clean_env

MiB = 1 << 20
GPU_STAGES = ["build", "info", "tests_cuda", "sanitizer", "bench", "pipeline", "large", "train_tp1_bf16",
              "train_tp2_gloo_fp4quant", "train_tp2_gloo_bf16"]
CPU_STAGES = ["machine", "projection", "data"]
OUT_FILES_MAX = 8  # what the device tool brings back from $OUT


def checkout_copy(dest: Path) -> Path:
    """What a fresh checkout of this working tree holds: the tracked files and the untracked ones
    git does not ignore (so that uncommitted work is what is tested), as they are on disk; no
    build, no venv, no data of a workflow run."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot tell the tracked files")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60).stdout
    names = [n for n in listed.split(b"\0") if n and (ROOT / os.fsdecode(n)).is_file()]  # less files deleted on disk
    dest.mkdir(parents=True, exist_ok=True)
    pack = subprocess.run(["tar", "-C", str(ROOT), "--null", "-T", "-", "-cf", "-"], input=b"\0".join(names),
                          capture_output=True, check=True, timeout=120)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=pack.stdout, check=True, timeout=120)
    return dest


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def stages_of(tsv: Path | str) -> dict[str, str]:
    return pd.read_csv(tsv, sep="\t", dtype={"status": str}).set_index("stage").status.to_dict()


def test_gpu_check_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", "-x", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_gpu_check_refuses_unknown_options():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--no-such-option"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "unknown option --no-such-option" in proc.stderr


def test_dry_run_on_a_clean_copy_packs_at_most_eight_files_into_out(tmp_path):
    """From nothing but what a checkout holds, on a CPU: the stages that need no GPU pass
    (the projection from the committed inputs among them), the GPU stages are skipped, not
    failed, the results lie outside the repository and OUT holds what the device tool brings back."""
    src = checkout_copy(tmp_path / "src")
    before = files_under(src)
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=src, capture_output=True, text=True,
                          timeout=170, env=clean_env(PYTHON=sys.executable, OUT=str(out), TMPDIR=str(tmp),
                                                     GPU_CHECK_TOKENS=str(tmp / "tokens")))
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert seconds < 60, f"the dry run took {seconds:.0f} s"
    assert files_under(src) == before  # nothing written into the repository
    results = [p for p in tmp.iterdir() if p.name.startswith("fp4quant-gpu-check-")]
    assert len(results) == 1, list(tmp.iterdir())
    back = sorted(p.name for p in out.iterdir())
    assert len(back) <= OUT_FILES_MAX
    assert {"gpu_check.tar.gz", "summary.txt", "report.md", "projection.csv"} <= set(back)
    assert all(p.stat().st_size < 16 * MiB for p in out.iterdir())
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
        base = results[0].name
        assert {f"{base}/stages.tsv", f"{base}/summary.txt", f"{base}/report.md", f"{base}/machine.log",
                f"{base}/provenance.json", f"{base}/projection.csv"} <= set(names)
        tar.extract(f"{base}/stages.tsv", tmp_path / "unpacked", filter="data")
    table = pd.read_csv(tmp_path / "unpacked" / base / "stages.tsv", sep="\t", dtype={"status": str})
    assert table[table.stage != "report"].cap_s.sum() == 520  # the caps add up to the default budget
    stages = stages_of(tmp_path / "unpacked" / base / "stages.tsv")
    assert list(stages) == ["machine", *GPU_STAGES[:7], "projection", "data", *GPU_STAGES[7:], "report"]
    assert all(stages[s] == "ok" for s in CPU_STAGES + ["report"]), stages
    assert all(stages[s] == "skipped (dry run)" for s in GPU_STAGES), stages
    report = (out / "report.md").read_text()
    assert "Skipped (dry run" in report and ", ".join(GPU_STAGES) in report
    assert "H100 (assumed)" in report and "What one GPU cannot show" in report and "no compressed message" in report
    summary = (out / "summary.txt").read_text()
    assert "dry run: every stage that needs no GPU passed" in summary and "FAILED" not in summary
    prov = json.loads((results[0] / "provenance.json").read_text())
    assert prov["dry_run"] is True and prov["cuda_archs"] == "9.0"


@pytest.mark.slow
def test_budget_cuts_a_hanging_stage_and_skips_the_rest_as_failed(tmp_path):
    """With a budget too small for the build (a setup.py that never ends): the build is cut
    (timed out), the stages after it are skipped and failed, the report still runs, OUT still
    gets its files, and the exit status is 1 with every failed stage named."""
    src = checkout_copy(tmp_path / "src")
    (src / "setup.py").write_text("import time\ntime.sleep(3600)\n")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "results")], cwd=src, capture_output=True,
                          text=True, timeout=300, env=clean_env(GPU_CHECK_BUDGET="18", PYTHON=sys.executable,
                                                                OUT=str(out), GPU_CHECK_TOKENS=str(tmp_path / "tok")))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    stages = stages_of(tmp_path / "results" / "stages.tsv")
    assert stages["machine"] == "ok" and stages["build"] == "failed(124)", stages
    skipped = {s for s, status in stages.items() if status == "skipped"}
    assert skipped >= {"info", "tests_cuda", "bench", "projection", "train_tp1_bf16"}, stages
    assert stages["report"] == "ok", stages
    summary = (out / "summary.txt").read_text()
    assert "-- build: FAILED (exit 124, timed out)" in summary and "SKIPPED, the time budget is spent" in summary
    last = summary.strip().splitlines()[-2]
    assert last.startswith("FAILED stages: build info tests_cuda sanitizer bench pipeline large projection"), last
    assert json.loads((tmp_path / "results" / "provenance.json").read_text())["script"] == "scripts/gpu_check.sh"
    missing = json.loads((tmp_path / "results" / "report.json").read_text())["missing"]
    assert {"kernels_cuda.csv", "pipeline_cuda.csv"} <= set(missing)


@pytest.mark.slow
def test_sigterm_stops_the_stage_and_still_packs_out(tmp_path):
    """Killed at its limit (SIGTERM), the run stops the stage in flight, records it, reports and
    packs what it had into OUT, and exits 143."""
    src = checkout_copy(tmp_path / "src")
    (src / "setup.py").write_text("import time\ntime.sleep(3600)\n")
    out, results = tmp_path / "out", tmp_path / "results"
    proc = subprocess.Popen(["bash", "scripts/gpu_check.sh", str(results)], cwd=src, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_env(PYTHON=sys.executable, OUT=str(out)))
    try:
        deadline = time.monotonic() + 120
        while not (results / "build.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (results / "build.log").exists(), "the build never started"
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stdout
    assert stages_of(results / "stages.tsv")["build"] == "interrupted"
    assert {"gpu_check.tar.gz", "summary.txt", "report.md"} <= {p.name for p in out.iterdir()}
    summary = (out / "summary.txt").read_text()
    assert "-- build: INTERRUPTED" in summary and "interrupted by SIGTERM" in summary
    assert "FAILED stages: build" in summary


def synthetic_results(folder: Path) -> None:
    """A GPU run's files as its stages write them: kernel rows of two dtypes (and two thread
    counts) at the same sizes, the pipeline, the large test, sanitizer logs, the CUDA tests."""
    rows = []
    for dtype, scale in (("float32", 1.0), ("bfloat16", 2.0)):
        for threads in (1, 16):
            for size, copy in ((MiB, 400.0), (64 * MiB, 2000.0)):
                rows += [("copy", "torch", "", dtype, size, threads, copy),
                         ("clone", "torch", "", dtype, size, threads, copy * 0.9),
                         ("cast_fp8", "torch", "e4m3fn", dtype, size, threads, copy * 0.6),
                         ("quantize", "native", "fp4quant", dtype, size, threads, copy * 0.75 / scale),
                         ("quantize", "native", "naive_pack", dtype, size, threads, copy * 0.5 / scale),
                         ("dequantize", "native", "fp4quant", dtype, size, threads, copy * 0.25 * scale),
                         ("quantize", "reference", "fp4quant", dtype, size, threads, 10.0)]
    pd.DataFrame([dict(op=o, impl=i, preset=p, dtype=d, size_bytes=s, threads=t, gbps=g, fraction=0.5, device="cuda")
                  for o, i, p, d, s, t, g in rows]).to_csv(folder / "kernels_cuda.csv", index=False)
    (folder / "kernels_cuda.csv.meta.json").write_text(json.dumps({"torchao": "absent"}))
    pd.DataFrame([dict(world=w, size_bytes=s, dtype=d, preset="fp4quant", quantize_s=1e-4, reduce_s=2e-4,
                       dequantize_s=1e-4, total_s=4e-4, gbps=s / 4e-4 / 1e9, copy_gbps=2000.0, fraction_of_limit=0.4,
                       device="cuda")
                  for w in (2, 4, 8) for s in (8 * MiB, 256 * MiB) for d in ("float32", "bfloat16")]).to_csv(
        folder / "pipeline_cuda.csv", index=False)
    (folder / "large.json").write_text(json.dumps({"numel": 2**31 + 2**20, "boundary": 2**31, "block": 2048,
                                                   "passed": True, "failures": [], "blocks_checked": [0, 1048576],
                                                   "dtypes": {"float32": {}, "bfloat16": {}}}))
    (folder / "sanitizer_memcheck.log").write_text("1008 op calls on cuda\n========= ERROR SUMMARY: 0 errors\n")
    (folder / "sanitizer_racecheck.log").write_text("========= ERROR SUMMARY: 2 errors\n")
    (folder / "junit_cuda.xml").write_text('<testsuites><testsuite name="pytest" tests="87" failures="0" errors="0" '
                                           'skipped="0"/></testsuites>')
    (folder / "train_tp2").mkdir()
    (folder / "train_tp2" / "summary.json").write_text(json.dumps({
        "provenance": {"config": {"comm": "fp4quant"}}, "mesh": {"tp": 2, "backend": "gloo", "device": "cuda"},
        "final_loss": 2.5, "val_loss": 2.6, "tokens_per_s": 1e5}))


def test_report_keys_kernel_rows_by_dtype_and_threads_not_size_alone(tmp_path):
    synthetic_results(tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report.md").read_text()
    assert "Series" not in text and "dtype: float64" not in text and "Name:" not in text
    report = json.loads((tmp_path / "report.json").read_text())
    fractions = {(r["op"], r["impl"], r["preset"], r["dtype"], r["size_bytes"], r["threads"]): r["fraction_of_copy"]
                 for r in report["kernels"]}
    assert len(fractions) == len(report["kernels"]) == 2 * 2 * 2 * 5  # one row per key, each against its own copy
    assert fractions[("quantize", "native", "fp4quant", "float32", 64 * MiB, 16)] == pytest.approx(0.75)
    assert fractions[("quantize", "native", "fp4quant", "bfloat16", 64 * MiB, 16)] == pytest.approx(0.375)
    assert fractions[("dequantize", "native", "fp4quant", "bfloat16", MiB, 1)] == pytest.approx(0.5)
    assert fractions[("cast_fp8", "torch", "e4m3fn", "float32", MiB, 1)] == pytest.approx(0.6)
    packing = {(p["dtype"], p["size_bytes"], p["threads"]): p["warp_over_naive"] for p in report["packing"]}
    assert len(packing) == 8 and all(v == pytest.approx(1.5) for v in packing.values())
    assert "| quantize | native | fp4quant | 1.5e+03 | 2e+03 | 0.75 | 0.5 |" in text
    assert "| quantize | native | fp4quant | 750 | 2e+03 | 0.375 | 0.5 |" in text
    assert "float32 input, 64 MiB" in text and "bfloat16 input, 64 MiB" in text
    assert "torchao: absent" in text
    assert [s["verdict"] for s in report["sanitizer"]] == ["clean", "ERRORS"]
    assert len(report["pipeline"]) == 12 and report["large"]["passed"] is True
    assert report["tests_cuda"] == {"tests": 87, "failures": 0, "errors": 0, "skipped": 0}
    assert "crossed a wire" in text and report["training"][0]["final_loss"] == 2.5
    assert report["missing"] == ["projection.csv"]


def test_report_reads_a_kernel_file_of_before_the_dtype_column(tmp_path):
    """No dtype, threads or copy rows (an older benchmark): float32, against torch.clone."""
    rows = [("clone", "torch", "", 64 * MiB, 2000.0), ("quantize", "native", "fp4quant", 64 * MiB, 1500.0),
            ("quantize", "native", "naive_pack", 64 * MiB, 1000.0)]
    pd.DataFrame([dict(op=o, impl=i, preset=p, size_bytes=s, gbps=g, device="cuda") for o, i, p, s, g in rows]).to_csv(
        tmp_path / "kernels_cuda.csv", index=False)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert {(r["preset"], r["dtype"], r["threads"]): r["fraction_of_copy"] for r in report["kernels"]} == {
        ("fp4quant", "float32", 1): 0.75, ("naive_pack", "float32", 1): 0.5}
    assert report["packing"][0]["warp_over_naive"] == 1.5


def test_report_of_an_empty_folder_says_what_is_missing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "report.json").read_text())["missing"] == [
        "kernels_cuda.csv", "pipeline_cuda.csv", "large.json", "projection.csv"]


def load_gpu_ops():
    spec = importlib.util.spec_from_file_location("fp4quant_gpu_ops", ROOT / "scripts" / "gpu_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_ops_once_calls_every_op_on_a_cpu(capsys):
    gpu_ops = load_gpu_ops()
    assert gpu_ops.main(["once", "--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert all(f"{preset}: ok" in out for preset in gpu_ops.COMPRESSED) and "op calls on cpu" in out


def test_gpu_ops_large_checks_blocks_either_side_of_the_boundary(tmp_path, monkeypatch):
    """At a small size on a CPU (boundary 2^15 for 2^31): the blocks pass; a message with one
    byte wrong past the boundary (what a wrapped 32-bit index would do) fails, naming its block."""
    gpu_ops = load_gpu_ops()
    numel, boundary = (1 << 16) + (1 << 12), 1 << 15
    args = ["large", "--device", "cpu", "--numel", str(numel), "--boundary", str(boundary), "--dtypes", "float32"]
    assert gpu_ops.main([*args, "--out", str(tmp_path / "large.json")]) == 0
    record = json.loads((tmp_path / "large.json").read_text())
    assert record["passed"] and record["blocks_checked"] == [0, 15, 16, 17, 33]
    real = gpu_ops.ops.quantize_rows

    def wrong_past_the_boundary(x, config, seed=0, offset=0):
        msg = real(x, config, seed, offset)
        if x.shape[1] == numel:
            msg = msg.clone()
            msg[0, -1] ^= 0x11  # a code byte of the last block
        return msg

    monkeypatch.setattr(gpu_ops.ops, "quantize_rows", wrong_past_the_boundary)
    assert gpu_ops.main([*args, "--out", str(tmp_path / "bad.json")]) == 1
    failures = json.loads((tmp_path / "bad.json").read_text())["failures"]
    assert any("quantize, block 33" in f for f in failures) and not any("block 0 " in f for f in failures)
