"""fp4quant's CUDA kernels built against a CUDA build of torch, checked without a GPU.

On a machine without a GPU (CI): the torch that scripts/bootstrap.py installs on an H100 lives
in a venv cached outside the repository (_cuda_venv.py); a copy of the sources is built against
it with this machine's nvcc (default targets) and with pip's nvcc (which ships no linkable
libcudart.so); the extension loads, `python -m fp4quant.info` reports CUDA kernels built by that
nvcc, and cuobjdump finds a cubin of every kernel file for each target and PTX for the highest.
On a GPU machine the same checks apply to the extension that `make setup` built.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _build_support import ROOT, clean_env, copy_sources, cuda_venv, cuobjdump, last_line, setup_py, site_packages
from fp4quant import toolchain

CUDA_STEMS = sorted(p.stem for p in (ROOT / "csrc" / "cuda").glob("*.cu"))
on_gpu_machine = bool(torch.version.cuda) and toolchain.nvidia_gpus() is not None


def check_cuda_build(python: str, workdir: Path, nvcc_version: str, cubins: list[str], ptx: list[str],
                     objdump: str | None) -> dict:
    """The extension that `python` imports from workdir has CUDA kernels for these targets."""
    proc = subprocess.run([python, "-m", "fp4quant.info", "--json"], cwd=workdir, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ext = json.loads(proc.stdout)["extension"]
    built = ext["built_with"]
    assert ext["loaded"] and ext["cuda_kernels"], ext
    assert ext["cuda_archs"] == ";".join(a + ("+PTX" if a in ptx else "") for a in cubins), ext
    assert (built["nvcc"]["version"], built["cuda_archs"], built["ptx_archs"]) == (nvcc_version, cubins, ptx), built
    text = subprocess.run([python, "-m", "fp4quant.info"], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert "CUDA kernels: yes" in text.stdout, text.stdout
    assert objdump, "no cuobjdump (not beside nvcc, not from pip: nvidia-cuda-cuobjdump, not in triton)"
    elf = subprocess.run([objdump, "--list-elf", ext["path"]], capture_output=True, text=True, check=True).stdout
    listed_ptx = subprocess.run([objdump, "--list-ptx", ext["path"]], capture_output=True, text=True, check=True).stdout
    assert set(re.findall(r"(\w+)\.sm_(\w+)\.cubin", elf)) == {(s, a) for s in CUDA_STEMS for a in cubins}, elf
    assert set(re.findall(r"(\w+)\.sm_(\w+)\.ptx", listed_ptx)) == {(s, a) for s in CUDA_STEMS for a in ptx}, listed_ptx
    return ext


@pytest.fixture(scope="module")
def venv():
    if on_gpu_machine:
        pytest.skip("a GPU machine builds against its own CUDA torch: test_installed_extension_has_cuda_kernels")
    if not toolchain.nvcc_candidates([], clean_env()):
        pytest.skip("no nvcc on this machine: the CUDA sources cannot be compiled here")
    return cuda_venv()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_cuda_build_with_the_system_nvcc(venv, tmp_path):
    folder, held = venv
    nvcc = toolchain.matching_nvcc(toolchain.nvcc_candidates([], clean_env()), tuple(held["torch_cuda"]))
    if nvcc is None:
        pytest.skip(f"this machine's nvcc is not for CUDA {held['torch_cuda'][0]}: the pip nvcc build covers it")
    src = copy_sources(tmp_path)
    proc = setup_py(src, folder / "bin" / "python", "build_ext", "--inplace", env=clean_env(CUDA_HOME=nvcc.home))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # the default targets on a machine without a GPU: A100 and H100 cubins, PTX of the highest
    check_cuda_build(str(folder / "bin" / "python"), src, toolchain.version_str(nvcc.version), ["80", "90"], ["90"],
                     cuobjdump(nvcc.home, site_packages(folder)))
    # the CPU kernels of this build still give the reference's bytes
    script = ("import torch; from fp4quant import ops, QuantConfig; from fp4quant.reference import codec as r\n"
              "x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)); c = QuantConfig()\n"
              "assert ops.backend('cpu') == 'native'\n"
              "assert torch.equal(ops.quantize_rows(x, c, 1, 0), r.quantize_rows(x, c, 1, 0)); print('ok')")
    run = subprocess.run([str(folder / "bin" / "python"), "-c", script], cwd=src, capture_output=True, text=True,
                         timeout=300)
    assert run.stdout.strip() == "ok", run.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_cuda_build_with_pips_nvcc_links_the_runtime(venv, tmp_path):
    """pip's nvcc (found in the venv without CUDA_HOME) ships libcudart.so.13 only: `-lcudart` links anyway."""
    folder, held = venv
    src = copy_sources(tmp_path)
    proc = setup_py(src, folder / "bin" / "python", "build_ext", "--inplace", env=clean_env(FP4QUANT_CUDA_ARCHS="9.0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = json.loads((src / "fp4quant" / "_build_info.json").read_text())
    site = site_packages(folder)
    assert Path(record["nvcc"]["path"]).is_relative_to(site), record["nvcc"]
    pip_nvcc = toolchain.nvcc_at(record["nvcc"]["path"], "pip")
    check_cuda_build(str(folder / "bin" / "python"), src, toolchain.version_str(pip_nvcc.version), ["90"], ["90"],
                     cuobjdump(None, site))


@pytest.mark.slow
def test_setup_refuses_an_nvcc_of_another_cuda_major(venv, tmp_path):
    folder, held = venv
    home = tmp_path / "cuda-12.4"
    (home / "bin").mkdir(parents=True)
    fake = home / "bin" / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    fake.chmod(0o755)
    (tmp_path / "src").mkdir()
    src = copy_sources(tmp_path / "src")
    proc = setup_py(src, folder / "bin" / "python", "--name", env=clean_env(CUDA_HOME=str(home)), timeout=300)
    assert proc.returncode != 0
    cuda = ".".join(map(str, held["torch_cuda"]))
    assert last_line(proc).startswith(
        f"fp4quant: nvcc 12.4.131 ({fake}, from CUDA_HOME) cannot build for torch {held['torch']}"), proc.stderr
    assert f"(CUDA {cuda}): the CUDA major versions differ" in last_line(proc)
    assert "cuda-toolkit[nvcc,cudart]==" in last_line(proc) and "FP4QUANT_CPU_ONLY=1" in last_line(proc)
    assert not (src / "fp4quant" / "_build_info.json").exists()


@pytest.mark.slow
def test_setup_names_an_unreadable_arch_list(venv, tmp_path):
    folder, _ = venv
    src = copy_sources(tmp_path)
    proc = setup_py(src, folder / "bin" / "python", "--name", env=clean_env(FP4QUANT_CUDA_ARCHS="9.0;hopper"),
                    timeout=300)
    assert proc.returncode != 0
    assert last_line(proc).startswith("fp4quant: FP4QUANT_CUDA_ARCHS='9.0;hopper': cannot read 'hopper'"), proc.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not on_gpu_machine, reason="no GPU machine with a CUDA torch: the tests above build one")
def test_installed_extension_has_cuda_kernels():
    from fp4quant.ops import _native

    record = _native.build_info
    assert record.get("nvcc"), f"fp4quant._C was built without CUDA kernels: {record or _native.unavailable_reason}"
    nvcc = toolchain.nvcc_at(record["nvcc"]["path"], "build record")
    gpus = toolchain.nvidia_gpus()
    archs, _ = toolchain.choose_archs(os.environ.get("FP4QUANT_CUDA_ARCHS"), toolchain.nvcc_archs(nvcc.path),
                                      gpus.compute_caps)
    site = Path(torch.__file__).parent.parent
    check_cuda_build(sys.executable, ROOT, toolchain.version_str(nvcc.version), list(archs.cubins), list(archs.ptx),
                     cuobjdump(record["nvcc"]["home"], site))
