"""setup.py with this checkout's torch: what it refuses before compiling, and its build record.

(The CUDA builds, and the refusals of setup.py that need a CUDA torch: test_cuda_build.py.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from _build_support import ROOT, clean_env, copy_sources, last_line, setup_py


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return copy_sources(tmp_path_factory.mktemp("src"))


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_gpu_machine_refuses_a_build_without_cuda_kernels(src, fake_gpu):
    proc = setup_py(src, sys.executable, "--name", env=clean_env(PATH=fake_gpu()), timeout=300)
    assert proc.returncode != 0
    last = last_line(proc)
    assert last.startswith(f"fp4quant: this machine has 1 GPU(s) (NVIDIA H100 80GB HBM3), driver 580.65.06 (CUDA <= "
                           f"13.0) but torch {torch.__version__} is a CPU build"), proc.stderr
    assert "FP4QUANT_CPU_ONLY=1" in last


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_gpu_machine_builds_cpu_kernels_when_asked(src, fake_gpu):
    proc = setup_py(src, sys.executable, "--name", env=clean_env(PATH=fake_gpu(), FP4QUANT_CPU_ONLY="1"), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "fp4quant", proc.stderr


def test_failed_build_writes_no_record(tmp_path):
    """The record is written after the library is built (test_cuda_build.py reads it), never before."""
    src = copy_sources(tmp_path)
    for source in [src / "csrc" / "binding.cpp", *(src / "csrc" / "cpu").glob("*.cpp")]:
        source.write_text('#include "deliberately_missing.h"\n' + source.read_text())  # fatal at once
    failed = setup_py(src, sys.executable, "build_ext", "--inplace", env=clean_env(FP4QUANT_CPU_ONLY="1"), timeout=900)
    assert failed.returncode != 0 and "deliberately_missing.h" in failed.stdout + failed.stderr
    assert not (src / "fp4quant" / "_build_info.json").exists()


def test_conda_environment_ties_pytorch_nvcc_and_cudart_to_one_cuda():
    deps = [d for d in yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"] if isinstance(d, str)]
    pins = dict(re.fullmatch(r"([\w-]+)=(\d+\.\d+)", d).groups() for d in deps if re.fullmatch(r"[\w-]+=\d+\.\d+", d))
    assert pins.get("cuda-version"), deps
    assert pins.get("cuda-nvcc") == pins["cuda-version"] and pins.get("cuda-cudart-dev") == pins["cuda-version"], pins
    pytorch = [d for d in deps if d.split()[0] == "pytorch"]
    assert pytorch and pytorch[0].split()[-1] == "cuda*", pytorch
