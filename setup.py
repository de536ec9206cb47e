"""Build of fp4quant's native extension (fp4quant._C).

- C++ CPU kernels always; the CUDA kernels (csrc/cuda) too when torch is a CUDA build and an
  nvcc of torch's CUDA major version is found: $CUDA_HOME's when set, else the first of pip's
  (nvidia/cu13/bin/nvcc in this environment), the one on PATH, /usr/local/cuda's.  An nvcc of
  another major version is an error, named before anything compiles.
- On a machine whose nvidia-smi lists a GPU, a build without CUDA kernels is an error unless
  FP4QUANT_CPU_ONLY=1 (which always builds the CPU kernels alone).
- FP4QUANT_CUDA_ARCHS: GPU targets, spelled as TORCH_CUDA_ARCH_LIST ("9.0", "90", "90a",
  "8.0;9.0", "80,90", "8.0 9.0+PTX"); default 8.0 and 9.0 plus the GPUs nvidia-smi lists.
  Cubins for each, PTX for the highest.  MAX_JOBS: parallel compile jobs (ninja).
- OpenMP: the CPU kernels are compiled with -fopenmp and linked to the OpenMP runtime torch ships
  (one runtime, one thread pool).
- FP4QUANT_NO_EXT=1: install pure Python (ops fall back to the reference).

Only after a successful build it writes _build_info.json beside the library (torch, the nvcc
that compiled the kernels, targets, flags, the library's checksum); importing fp4quant checks
it against the running torch and the library (fp4quant/ops/_native.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import site
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
LINK_DIR = ROOT / "build" / "cuda-link"  # libcudart.so where the toolkit ships only libcudart.so.N


# fp4quant/toolchain.py by path: the package itself cannot be imported before torch and the build
_spec = importlib.util.spec_from_file_location("fp4quant_toolchain", ROOT / "fp4quant" / "toolchain.py")
toolchain = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toolchain)


def fail(message: str):
    sys.exit(f"fp4quant: {message}")


def cxx_flags(openmp) -> list[str]:
    flags = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wno-unused-function"]
    return flags + (openmp.compile_flags() if openmp else [])


def nvcc_flags(archs) -> list[str]:
    # --fmad=false: no fused multiply-add, the reference rounds each product (docs/format.md)
    return ["-O3", "-std=c++17", "--fmad=false", "-lineinfo", *archs.gencode_flags()]


def link_flags(openmp) -> list[str]:
    return openmp.link_flags() if openmp else []


def site_dirs() -> list[str]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    return list(dict.fromkeys(dirs))


def build_plan():
    """(torch, nvcc or None, GPU targets or None): what to build, decided before compiling."""
    import torch

    gpus = toolchain.nvidia_gpus()
    found = toolchain.nvcc_candidates(site_dirs()) if torch.version.cuda else []
    try:
        nvcc = toolchain.build_nvcc(torch.__version__, torch.version.cuda, gpus, found)
        if nvcc is None:
            if torch.version.cuda and os.environ.get("FP4QUANT_CPU_ONLY") != "1":
                print(f"fp4quant: torch {torch.__version__} is a CUDA build but no nvcc was found (and no GPU is "
                      "here): building the CPU kernels only", file=sys.stderr)
            return torch, None, None
        archs, dropped = toolchain.choose_archs(os.environ.get("FP4QUANT_CUDA_ARCHS"), toolchain.nvcc_archs(nvcc.path),
                                                gpus.compute_caps if gpus else ())
    except (toolchain.BuildError, toolchain.ArchError) as exc:
        fail(str(exc))
    if dropped:
        print(f"fp4quant: {nvcc.describe()} cannot target {dropped}; building for {archs.spelling()}", file=sys.stderr)
    return torch, nvcc, archs


def extensions():
    if os.environ.get("FP4QUANT_NO_EXT") == "1":
        return [], {}
    torch, nvcc, archs = build_plan()
    if nvcc:
        os.environ["CUDA_HOME"] = nvcc.home  # before cpp_extension reads it, so torch compiles with this nvcc
    from torch.utils import cpp_extension

    # at::parallel_for is an OpenMP region inlined from ATen's headers: without -fopenmp it runs serially
    openmp = toolchain.torch_openmp(Path(torch.__file__).parent)
    if openmp is None:
        print(f"fp4quant: torch {torch.__version__} ships no OpenMP runtime: the CPU kernels will run on one thread",
              file=sys.stderr)
    sources = ["csrc/binding.cpp", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cpu").glob("*.cpp"))]
    record = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "nvcc": None, "cuda_archs": [],
              "ptx_archs": [], "cxx_flags": cxx_flags(openmp),
              "openmp": str(openmp.library) if openmp else None}
    if nvcc:
        try:
            includes, lib_dirs = toolchain.cudart_paths(nvcc.home, LINK_DIR)
        except toolchain.BuildError as exc:
            fail(str(exc))
        ext = cpp_extension.CUDAExtension(
            "fp4quant._C",
            sources + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cuda").glob("*.cu")),
            define_macros=[("FP4QUANT_WITH_CUDA", None), ("FP4QUANT_CUDA_ARCHS", f'"{archs.spelling()}"')],
            include_dirs=includes, library_dirs=lib_dirs,
            extra_compile_args={"cxx": cxx_flags(openmp), "nvcc": nvcc_flags(archs)},
            extra_link_args=link_flags(openmp),
        )
        record.update(nvcc={"version": toolchain.version_str(nvcc.version), "path": nvcc.path, "home": nvcc.home},
                      cuda_archs=list(archs.cubins), ptx_archs=list(archs.ptx), nvcc_flags=nvcc_flags(archs))
    else:
        ext = cpp_extension.CppExtension("fp4quant._C", sources, extra_compile_args={"cxx": cxx_flags(openmp)},
                                         extra_link_args=link_flags(openmp))

    class Build(cpp_extension.BuildExtension):
        """torch's build, then the build record beside the library it made."""

        def run(self):
            super().run()
            library = Path(self.get_ext_fullpath("fp4quant._C"))
            record["library"] = library.name
            record["library_sha256"] = hashlib.sha256(library.read_bytes()).hexdigest()
            out = library.parent / "_build_info.json"
            tmp = out.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            tmp.replace(out)

    return [ext], {"build_ext": Build.with_options(use_ninja=True)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
