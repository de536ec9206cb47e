"""scripts/bootstrap.py: which torch and nvcc it installs, decided before anything heavy is installed.

The decisions run on machines described by value (driver, nvcc, what the index offers); the
script itself runs with a fake nvidia-smi on PATH and --dry-run, resolving against this
machine's real package index.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _build_support import ROOT, clean_env, load_bootstrap
from fp4quant.toolchain import Gpus, Nvcc, TorchBuild

bootstrap = load_bootstrap()
H100_R580 = Gpus(("NVIDIA H100 80GB HBM3",), "580.65.06", (13, 0), ("9.0",))
H100_R550 = Gpus(("NVIDIA H100 80GB HBM3",), "550.54.15", (12, 4), ("9.0",))
H100_R470 = Gpus(("NVIDIA H100 80GB HBM3",), "470.256.02", (11, 4), ("9.0",))
NVCC_13 = Nvcc("/usr/local/cuda-13.0/bin/nvcc", (13, 0, 88), "PATH", "/usr/local/cuda-13.0")
NVCC_12 = Nvcc("/usr/local/cuda-12.4/bin/nvcc", (12, 4, 131), "PATH", "/usr/local/cuda-12.4")
CU130 = TorchBuild("2.14.1", (13, 0), ("cuda-toolkit[cudart]==13.0.3",))
CU132 = TorchBuild("2.15.0", (13, 2), ("cuda-toolkit[cudart]==13.2.2",))
CU128 = TorchBuild("2.14.1+cu128", (12, 8), (), bootstrap.PYTORCH_INDEX + "cu128")
INDEX = bootstrap.PYTORCH_INDEX


def offers(default, **by_tag):
    """What pip resolves, as torch_choices yields it: the default index, then PyTorch's per-CUDA ones."""
    def choices(gpus):
        yield ["torch"], default
        for tag in bootstrap.CUDA_VARIANTS:
            if gpus.runs((int(tag[2:-1]), int(tag[-1]))):
                yield ["torch", "--index-url", INDEX + tag], by_tag.get(tag)
    return choices


def plan(gpus, nvccs, choices, pip_has_nvcc=True):
    return bootstrap.plan_gpu(gpus, nvccs, choices(gpus), lambda reqs: pip_has_nvcc)


def test_default_torch_with_the_system_nvcc():
    p = plan(H100_R580, [NVCC_13], offers(CU130))
    assert (p.torch_args, p.build, p.nvcc, p.pip_nvcc) == (["torch"], CU130, NVCC_13, [])


def test_newer_cuda_minor_than_the_driver_runs_on_it():
    p = plan(H100_R580, [NVCC_13], offers(CU132))  # the torch 2.15.0+cu132 on an R580 driver
    assert p.build == CU132 and p.nvcc == NVCC_13


def test_system_nvcc_of_another_major_gets_pips_nvcc_of_torchs_cuda():
    p = plan(H100_R580, [NVCC_12], offers(CU132))
    assert p.nvcc is None and p.pip_nvcc == ["cuda-toolkit[nvcc,cudart]==13.2.2"]
    p = plan(H100_R580, [], offers(CU130))  # no nvcc at all
    assert p.pip_nvcc == ["cuda-toolkit[nvcc,cudart]==13.0.3"]


def test_driver_too_old_for_the_default_torch_gets_pytorchs_build_for_its_cuda():
    p = plan(H100_R550, [NVCC_12], offers(CU132, cu128=CU128))
    assert p.torch_args == ["torch", "--index-url", INDEX + "cu128"] and p.build == CU128 and p.nvcc == NVCC_12


def test_no_combination_names_driver_nvcc_torch_and_what_to_install():
    with pytest.raises(bootstrap.NoCombination) as err:
        plan(H100_R470, [NVCC_12], offers(CU132))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("fp4quant: no torch build fits this machine: 1 GPU(s) (NVIDIA H100 80GB HBM3), driver "
                          "470.256.02 (CUDA <= 11.4); nvcc 12.4.131 (/usr/local/cuda-12.4/bin/nvcc, from PATH)")
    assert "torch 2.15.0 (CUDA 13.2) needs a driver for CUDA 13 (R580+)" in msg
    assert "no torch for this Python from PyTorch's cu118 (or unreachable)" in msg
    assert "Install an NVIDIA driver" in msg and "FP4QUANT_TORCH=" in msg and "FP4QUANT_CPU_ONLY=1" in msg


def test_no_pip_nvcc_for_torchs_cuda_is_named():
    with pytest.raises(bootstrap.NoCombination, match=r"torch 2.14.1 \(CUDA 13.0\) needs nvcc 13.x, and pip finds no "
                                                      r"cuda-toolkit\[nvcc,cudart\]==13.0.3"):
        plan(H100_R580, [NVCC_12], offers(CU130), pip_has_nvcc=False)


def test_a_cpu_build_is_no_choice_on_a_gpu_machine():
    with pytest.raises(bootstrap.NoCombination, match=r"torch 2.13.0\+cpu \(CPU only\) has no CUDA"):
        bootstrap.plan_gpu(H100_R580, [NVCC_13], iter([(["torch==2.13.0"], TorchBuild("2.13.0+cpu", None))]),
                           lambda reqs: True, explicit=True)


def test_the_resolved_version_is_what_installs():
    assert bootstrap.pinned(["torch", "--index-url", INDEX + "cu128"], "2.14.1+cu128") == [
        "torch==2.14.1+cu128", "--index-url", INDEX + "cu128"]
    assert bootstrap.pinned(["--pre", "torch>=2.4"], "2.15.0") == ["--pre", "torch==2.15.0"]


# ---- the script, with a fake nvidia-smi ------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """One venv for the script's runs below: none of them may install anything into it."""
    return tmp_path_factory.mktemp("bootstrap") / "venv"


def bootstrap_script(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bootstrap.py"), "--venv", str(venv), *args],
                          env=clean_env(**env), capture_output=True, text=True, timeout=600)


def installed(venv: Path) -> list[str]:
    return [p.name for p in venv.glob("lib/python3*/site-packages/*") if p.name.startswith(("torch", "nvidia"))]


@pytest.mark.slow
def test_script_on_a_cpu_machine_plans_the_cpu_torch(venv):
    proc = bootstrap_script(venv, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    if out["gpus"] is not None:
        pytest.skip("this machine has a GPU")
    assert out["torch"] is None and out["nvcc"] is None and out["torch_args"][0].startswith("torch")


@pytest.mark.slow
def test_script_on_an_r580_gpu_machine_plans_a_cuda_torch_and_stops(venv, fake_gpu):
    path = fake_gpu(driver="580.65.06", cuda="13.0")
    proc = bootstrap_script(venv, "--dry-run", PATH=path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["gpus"]["driver"] == "580.65.06" and out["torch"]["cuda"][0] == 13, out
    assert out["torch_args"][0] == f"torch=={out['torch']['version']}"
    assert out["nvcc"] is not None or out["pip_nvcc"], out
    assert installed(venv) == []


@pytest.mark.slow
def test_script_stops_before_installing_when_nothing_fits(venv, fake_gpu):
    """A driver for CUDA 12.4 and a torch for CUDA 13 (FP4QUANT_TORCH: no other index is tried)."""
    path = fake_gpu(driver="550.54.15", cuda="12.4")
    proc = bootstrap_script(venv, PATH=path, FP4QUANT_TORCH="torch==2.14.1")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fp4quant:")]
    assert len(lines) == 1 and "driver 550.54.15 (CUDA <= 12.4)" in lines[0], proc.stderr
    assert "torch 2.14.1 (CUDA 13.0) needs a driver for CUDA 13 (R580+)" in lines[0]
    assert installed(venv) == []
