"""fp4quant.toolchain: reading nvidia-smi, nvcc and torch's metadata, GPU targets, and the build's choices."""

from __future__ import annotations

import pytest

from fp4quant import toolchain
from fp4quant.toolchain import ArchError, BuildError, Gpus, Nvcc, TorchBuild

H100 = Gpus(("NVIDIA H100 80GB HBM3",), "580.65.06", (13, 0), ("9.0",))
OLD_DRIVER = Gpus(("NVIDIA H100 80GB HBM3",), "550.54.15", (12, 4), ("9.0",))
NVCC_13 = Nvcc("/usr/local/cuda-13.0/bin/nvcc", (13, 0, 88), "PATH", "/usr/local/cuda-13.0")
NVCC_12 = Nvcc("/usr/local/cuda-12.4/bin/nvcc", (12, 4, 131), "PATH", "/usr/local/cuda-12.4")


# ---- GPU targets ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, archs, marked", [
    ("9.0", ["90"], []),
    ("90", ["90"], []),
    ("90a", ["90a"], []),
    ("sm_90", ["90"], []),
    ("8.0;9.0", ["80", "90"], []),
    ("80,90", ["80", "90"], []),
    (" 9.0  8.0 ", ["80", "90"], []),
    ("8.0; 9.0+PTX", ["80", "90"], ["90"]),
    ("10.0;9.0a,12.0", ["90a", "100", "120"], []),
    ("9.0;90", ["90"], []),
])
def test_arch_spellings_of_torch_cuda_arch_list(spec, archs, marked):
    assert toolchain.parse_archs(spec) == (archs, marked)


@pytest.mark.parametrize("spec", ["9", "hopper", "9.0;x", "", " ; ", "sm90.1"])
def test_unreadable_arch_lists_are_named(spec):
    with pytest.raises(ArchError, match=r"FP4QUANT_CUDA_ARCHS=.*(cannot read|names no GPU)"):
        toolchain.parse_archs(spec)


def test_default_targets_are_a100_and_h100_with_ptx_of_the_highest():
    archs, dropped = toolchain.choose_archs(None, {"75", "80", "90", "100"})
    assert (archs.cubins, archs.ptx, dropped) == (("80", "90"), ("90",), [])
    assert archs.gencode_flags() == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
                                     "-gencode=arch=compute_90,code=compute_90"]
    assert archs.spelling() == "80;90+PTX"


def test_default_targets_add_this_machines_gpus():
    archs, _ = toolchain.choose_archs(None, {"80", "90", "100", "120"}, ("12.0", "9.0"))
    assert (archs.cubins, archs.ptx) == (("80", "90", "120"), ("120",))


def test_ptx_of_an_arch_specific_target_is_its_portable_form():
    archs, _ = toolchain.choose_archs("8.0;9.0a", {"80", "90"})
    assert archs.cubins == ("80", "90a") and archs.ptx == ("90",)
    assert archs.gencode_flags()[-1] == "-gencode=arch=compute_90,code=compute_90"


def test_targets_nvcc_cannot_build_are_dropped_or_refused():
    archs, dropped = toolchain.choose_archs("7.0;9.0", {"75", "80", "90"})
    assert archs.cubins == ("90",) and dropped == ["70"]
    with pytest.raises(ArchError, match=r"cannot build for any of \['60', '70'\]"):
        toolchain.choose_archs("6.0,7.0", {"75", "80", "90"})


def test_marked_ptx_is_kept_beside_the_highest():
    archs, _ = toolchain.choose_archs("8.0+PTX;9.0", {"80", "90"})
    assert archs.ptx == ("80", "90")


# ---- nvidia-smi and nvcc ---------------------------------------------------------------------


def test_no_nvidia_smi_means_no_gpus(tmp_path):
    assert toolchain.nvidia_gpus(str(tmp_path / "missing")) is None


def test_nvidia_smi_listing_a_gpu_is_read(fake_gpu):
    fake_gpu(driver="550.54.15", cuda="12.4", name="NVIDIA A100-SXM4-80GB", cap="8.0")
    gpus = toolchain.nvidia_gpus()
    assert gpus == Gpus(("NVIDIA A100-SXM4-80GB",), "550.54.15", (12, 4), ("8.0",))
    assert gpus.describe() == "1 GPU(s) (NVIDIA A100-SXM4-80GB), driver 550.54.15 (CUDA <= 12.4)"


def test_driver_cuda_from_the_branch_when_nvidia_smi_does_not_print_it():
    assert toolchain.driver_branch_cuda("580.65.06") == (13, 0)
    assert toolchain.driver_branch_cuda("535.183.01") == (12, 2)
    assert toolchain.driver_branch_cuda("390.1") is None


def test_a_driver_runs_its_cuda_major_and_older():
    assert H100.runs((13, 2)) and H100.runs((12, 8))  # minor-version compatibility within CUDA 13
    assert OLD_DRIVER.runs((12, 8)) and not OLD_DRIVER.runs((13, 0))


def test_nvcc_version_and_home(tmp_path):
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    fake.chmod(0o755)
    assert toolchain.nvcc_at(fake, "test") == Nvcc(str(fake), (12, 4, 131), "test", str(tmp_path / "cuda"))
    assert toolchain.nvcc_at(tmp_path / "none", "test") is None


def test_cuda_home_alone_is_used_when_set(tmp_path):
    assert toolchain.nvcc_candidates([], {"CUDA_HOME": str(tmp_path), "PATH": ""}) == []


def test_pips_nvcc_is_found_in_site_packages(tmp_path):
    for layout in ("cu13", "cuda_nvcc"):
        (tmp_path / "nvidia" / layout / "bin").mkdir(parents=True)
        (tmp_path / "nvidia" / layout / "bin" / "nvcc").touch()
    assert toolchain.pip_nvccs([str(tmp_path)]) == [str(tmp_path / "nvidia" / d / "bin" / "nvcc")
                                                    for d in ("cuda_nvcc", "cu13")]


# ---- torch builds ---------------------------------------------------------------------------

TORCH_CU130_REQUIRES = ["filelock", 'cuda-toolkit[cublas,cudart,cufft]==13.0.3; platform_system == "Linux"',
                        "nvidia-nccl-cu13==2.30.7", 'optree>=0.13.0; extra == "optree"']


def test_cuda_of_a_torch_wheel():
    assert toolchain.torch_build("2.14.1", TORCH_CU130_REQUIRES).cuda == (13, 0)
    assert toolchain.torch_build("2.7.1", ["nvidia-cuda-runtime-cu12==12.6.77"]).cuda == (12, 6)
    assert toolchain.torch_build("2.7.1+cu128", []).cuda == (12, 8)
    assert toolchain.torch_build("2.13.0+cpu", ["filelock"]).cuda is None


def test_pips_nvcc_for_a_torch_build():
    assert toolchain.pip_nvcc_requirements(toolchain.torch_build("2.14.1", TORCH_CU130_REQUIRES)) == [
        "cuda-toolkit[nvcc,cudart]==13.0.3"]
    assert toolchain.pip_nvcc_requirements(TorchBuild("2.15.0", (13, 2))) == ["cuda-toolkit[nvcc,cudart]==13.2.*"]
    assert toolchain.pip_nvcc_requirements(TorchBuild("2.7.1+cu126", (12, 6))) == [
        "nvidia-cuda-nvcc-cu12==12.6.*", "nvidia-cuda-runtime-cu12==12.6.*"]


# ---- what setup.py builds -------------------------------------------------------------------


def test_cpu_torch_on_a_gpu_machine_is_refused_unless_asked():
    with pytest.raises(BuildError, match=r"has 1 GPU\(s\) \(NVIDIA H100 80GB HBM3\), driver 580.65.06 .* but torch "
                                         r"2.13.0\+cpu is a CPU build.*FP4QUANT_CPU_ONLY=1"):
        toolchain.build_nvcc("2.13.0+cpu", None, H100, [], env={})
    assert toolchain.build_nvcc("2.13.0+cpu", None, H100, [], env={"FP4QUANT_CPU_ONLY": "1"}) is None
    assert toolchain.build_nvcc("2.13.0+cpu", None, None, [], env={}) is None


def test_nvcc_of_torchs_cuda_major_is_chosen():
    assert toolchain.build_nvcc("2.14.1+cu130", "13.0", H100, [NVCC_12, NVCC_13], env={}) == NVCC_13
    assert toolchain.build_nvcc("2.15.0+cu132", "13.2", None, [NVCC_13], env={}) == NVCC_13  # minor may differ


def test_nvcc_of_another_cuda_major_is_refused_before_compiling():
    with pytest.raises(BuildError) as err:
        toolchain.build_nvcc("2.15.0+cu132", "13.2", H100, [NVCC_12], env={})
    msg = str(err.value)
    assert msg.startswith("nvcc 12.4.131 (/usr/local/cuda-12.4/bin/nvcc, from PATH) cannot build for torch "
                          "2.15.0+cu132 (CUDA 13.2): the CUDA major versions differ")
    assert "pip install 'cuda-toolkit[nvcc,cudart]==13.2.*'" in msg and "\n" not in msg


def test_gpu_machine_without_nvcc_is_refused():
    with pytest.raises(BuildError, match=r"has 1 GPU.* but no nvcc was found .*CUDA 13"):
        toolchain.build_nvcc("2.14.1+cu130", "13.0", H100, [], env={})
    with pytest.raises(BuildError, match=r"CUDA_HOME=/opt/cuda has no working bin/nvcc"):
        toolchain.build_nvcc("2.14.1+cu130", "13.0", None, [], env={"CUDA_HOME": "/opt/cuda"})
    assert toolchain.build_nvcc("2.14.1+cu130", "13.0", None, [], env={}) is None  # no GPU, no nvcc: CPU kernels


def test_pip_runtime_without_a_linkable_libcudart_gets_one(tmp_path):
    home = tmp_path / "site" / "nvidia" / "cu13"
    (home / "lib").mkdir(parents=True)
    (home / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF")
    includes, libs = toolchain.cudart_paths(str(home), tmp_path / "link")
    assert includes == [] and libs == [str(tmp_path / "link")]
    assert (tmp_path / "link" / "libcudart.so").resolve() == (home / "lib" / "libcudart.so.13").resolve()


def test_cuda12_pip_runtime_in_its_sibling_package(tmp_path):
    nvcc_home, runtime = tmp_path / "nvidia" / "cuda_nvcc", tmp_path / "nvidia" / "cuda_runtime"
    (nvcc_home / "bin").mkdir(parents=True)
    (runtime / "include").mkdir(parents=True)
    (runtime / "include" / "cuda_runtime.h").touch()
    (runtime / "lib").mkdir()
    (runtime / "lib" / "libcudart.so.12").touch()
    includes, libs = toolchain.cudart_paths(str(nvcc_home), tmp_path / "link")
    assert includes == [str(runtime / "include")] and libs == [str(tmp_path / "link")]


def test_conda_forge_runtime_under_targets(tmp_path):
    include, lib = tmp_path / "targets" / "x86_64-linux" / "include", tmp_path / "targets" / "x86_64-linux" / "lib"
    include.mkdir(parents=True)
    (include / "cuda_runtime.h").touch()
    lib.mkdir()
    (lib / "libcudart.so").touch()
    (tmp_path / "lib").mkdir()
    assert toolchain.cudart_paths(str(tmp_path), tmp_path / "link") == ([str(include)], [str(lib)])


def test_a_toolkit_needs_no_extra_paths_and_a_missing_runtime_is_named(tmp_path):
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libcudart.so").touch()
    assert toolchain.cudart_paths(str(tmp_path), tmp_path / "link") == ([], [])
    with pytest.raises(BuildError, match="libcudart.so\\) is missing beside nvcc"):
        toolchain.cudart_paths(str(tmp_path / "empty"), tmp_path / "link")


def test_torch_openmp_finds_the_runtime_torch_ships(tmp_path):
    torch_dir = tmp_path / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    assert toolchain.torch_openmp(torch_dir) is None
    (tmp_path / "torch.libs").mkdir()
    (tmp_path / "torch.libs" / "libgomp-a34b3233.so.1").write_bytes(b"")  # auditwheel's renamed copy
    found = toolchain.torch_openmp(torch_dir)
    assert found.library.name == "libgomp-a34b3233.so.1"
    assert found.link_flags() == [f"-L{tmp_path / 'torch.libs'}", "-l:libgomp-a34b3233.so.1",
                                  f"-Wl,-rpath,{tmp_path / 'torch.libs'}"]
    (torch_dir / "lib" / "libgomp.so.1").write_bytes(b"")  # torch/lib first, as the CPU wheel ships it
    assert toolchain.torch_openmp(torch_dir).library == torch_dir / "lib" / "libgomp.so.1"
    assert found.compile_flags() == ["-fopenmp"]
