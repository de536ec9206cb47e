"""The cheap exact encoders of the specialized CUDA quantize kernels (csrc/fp4quant.h:
e2m1_code_rne, e4m3_scale_nearest, div_const_rn), checked against the reference's rounding for
every finite non-negative float, on the CPU: the same FP4Q_HD source compiled as C++ by a small
harness (tests/ops/cuda_emu/encoders.cpp), with FP contraction off as the kernels' contract wants.

FP4QUANT_ENCODERS=sample checks the binades that hold every decision densely and a 1-in-97 sample
elsewhere (a few seconds) instead of all 2**31 - 2**23 patterns (about a minute on 2 cores)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).parent / "cuda_emu" / "encoders.cpp"


def cpu_has_fma() -> bool:
    try:
        return " fma " in f" {Path('/proc/cpuinfo').read_text()} ".replace("\n", " ")
    except OSError:
        return False


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("encoders") / "encoders"
    # -ffp-contract=off: the host side of the FP4Q_HD functions uses the plain operators;
    # -mfma only makes __builtin_fmaf (fma_rn's host side) an instruction instead of libm's fmaf
    flags = ["-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread"]
    flags += ["-mfma"] if cpu_has_fma() else []
    cmd = [cxx, *flags, f"-I{ROOT / 'csrc'}", str(HARNESS), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def test_encoders_sample_every_decision_binade(encoders):
    proc = subprocess.run([str(encoders), "sample", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and " 0 mismatches" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_encoders_match_the_reference_on_every_float(encoders):
    mode = os.environ.get("FP4QUANT_ENCODERS", "all")
    proc = subprocess.run([str(encoders), mode, "2"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0 and " 0 mismatches" in proc.stdout, proc.stdout[-3000:]
    if mode == "all":
        assert "2139095040 floats checked" in proc.stdout, proc.stdout  # 0 .. 0x7F7FFFFF
