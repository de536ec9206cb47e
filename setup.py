"""Build of fp4quant's native extension (fp4quant._C).

- A CppExtension (C++ CPU kernels) when torch has no CUDA, a CUDAExtension (plus the
  CUDA kernels in csrc/cuda) when torch is a CUDA build and nvcc is found.
- FP4QUANT_CUDA_ARCHS: GPU targets, e.g. "90" or "80;90" (default 90), filtered by what
  the installed nvcc supports.  MAX_JOBS: parallel compile jobs (ninja).
- FP4QUANT_NO_EXT=1: install pure Python (ops fall back to the reference).

The build writes fp4quant/_build_info.json (torch, CUDA, archs, CPU kernels) beside the
library; importing fp4quant compares it with the running torch (fp4quant/ops/_native.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
CXX_FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wno-unused-function"]
# --fmad=false: no fused multiply-add, the reference rounds each product (docs/format.md)
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-lineinfo"]


def nvcc_supported_archs(nvcc: str) -> set[str]:
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {line.strip().split("_", 1)[1] for line in out.split() if line.strip().startswith("compute_")}


def cuda_archs(nvcc: str) -> list[str]:
    wanted = [a.strip() for a in os.environ.get("FP4QUANT_CUDA_ARCHS", "90").replace(",", ";").split(";") if a.strip()]
    supported = nvcc_supported_archs(nvcc)
    archs = [a for a in wanted if not supported or a in supported]
    dropped = sorted(set(wanted) - set(archs))
    if dropped:
        print(f"fp4quant: nvcc does not support sm_{', sm_'.join(dropped)}; building for {archs}", file=sys.stderr)
    if not archs:
        raise RuntimeError(f"fp4quant: none of FP4QUANT_CUDA_ARCHS={wanted} is supported by {nvcc} ({sorted(supported)})")
    return archs


def extensions():
    if os.environ.get("FP4QUANT_NO_EXT") == "1":
        return [], {}
    import torch
    from torch.utils import cpp_extension

    cpu_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cpu").glob("*.cpp"))
    sources = ["csrc/binding.cpp", *cpu_sources]
    info = {"torch": torch.__version__, "cuda": None, "cuda_archs": [], "cxx_flags": CXX_FLAGS}
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else None
    if torch.version.cuda and nvcc and os.path.exists(nvcc):
        archs = cuda_archs(nvcc)
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        ext = cpp_extension.CUDAExtension(
            "fp4quant._C",
            sources + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cuda").glob("*.cu")),
            define_macros=[("FP4QUANT_WITH_CUDA", None), ("FP4QUANT_CUDA_ARCHS", f'"{";".join(archs)}"')],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS + gencode},
        )
        info.update(cuda=torch.version.cuda, cuda_archs=archs)
    else:
        ext = cpp_extension.CppExtension("fp4quant._C", sources, extra_compile_args={"cxx": CXX_FLAGS})
    (ROOT / "fp4quant" / "_build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    build_ext = cpp_extension.BuildExtension.with_options(use_ninja=True)
    return [ext], {"build_ext": build_ext}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
