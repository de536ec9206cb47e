"""The environment variables fp4quant reads: the one table (docs/environment.md shows it,
``python -m fp4quant.info`` prints each with its value, a test keeps all three in step).

None of them changes what a run computes: behaviour is chosen by config objects
(TrainConfig, CommConfig, QuantConfig and the collectives' arguments).  The variables
only say how to build and install, record provenance where git cannot, help debug
(forcing a slower path that gives the same bytes), or -- set by the emulated cluster's
runner for its ranks only -- stretch time (sleeps, never a value).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KINDS = ("install", "build", "provenance", "debug", "tests", "cluster")


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # one of KINDS
    read_by: str
    meaning: str


VARIABLES = (
    Variable("FP4QUANT_TORCH", "install", "scripts/bootstrap.py",
             "the torch to install instead, as pip arguments, e.g. `torch==2.7.1 --index-url "
             "https://download.pytorch.org/whl/cu126`"),
    Variable("FP4QUANT_CPU_ONLY", "build", "setup.py, scripts/bootstrap.py, fp4quant/toolchain.py",
             "`1`: build the CPU kernels alone, even on a GPU machine (`make setup` then installs the CPU torch)"),
    Variable("FP4QUANT_CUDA_ARCHS", "build", "setup.py, fp4quant/toolchain.py",
             "GPU targets, spelled as `TORCH_CUDA_ARCH_LIST`: `9.0`, `90`, `90a`, `8.0;9.0`, `80,90`, `8.0 9.0+PTX`. "
             "Default: 8.0 and 9.0 plus the GPUs `nvidia-smi` lists; a cubin for each, PTX for the highest"),
    Variable("FP4QUANT_NO_EXT", "build", "setup.py",
             "`1`: install pure Python (the ops run the reference)"),
    Variable("CUDA_HOME", "build", "setup.py, fp4quant/toolchain.py",
             "the CUDA toolkit to compile with (its `bin/nvcc`); unset: pip's nvcc in the environment, "
             "then `nvcc` on `PATH`, then `/usr/local/cuda`"),
    Variable("CUDA_PATH", "build", "fp4quant/toolchain.py", "read where `CUDA_HOME` is unset, as CUDA_HOME"),
    Variable("MAX_JOBS", "build", "setup.py (torch's cpp_extension)", "parallel compile jobs (ninja)"),
    Variable("FP4QUANT_COMMIT", "provenance", "fp4quant/provenance.py",
             "the commit recorded in provenance where git cannot tell (a source archive)"),
    Variable("FP4QUANT_CODE", "provenance", "fp4quant/provenance.py",
             "the training code's digest recorded in provenance where git cannot tell (a source archive)"),
    Variable("FP4QUANT_BACKEND", "debug", "fp4quant/ops/_native.py (at import)",
             "`reference`: do not load the native extension; the ops run the pure-PyTorch reference "
             "(the same bytes, slower)"),
    Variable("FP4QUANT_CPU_ISA", "debug", "csrc/cpu/dispatch.cpp (at load)",
             "`scalar`, `avx2` or `avx512`: the CPU kernels use that instruction set if the CPU has it "
             "(the same bytes)"),
    Variable("FP4QUANT_NO_CLUSTER", "debug", "fp4quant/cluster/netns.py",
             "`1`: never build the emulated cluster (network namespaces); run on loopback"),
    Variable("FP4QUANT_CLUSTER_LATENCY_S", "cluster", "fp4quant/cluster/rank.py (dilation_from_env)",
             "set by `python -m fp4quant.cluster run` for its ranks only: seconds slept before each wire step of a "
             "collective (the dilated per-hop latency; fp4quant.cluster.dilation); finite, >= 0; unset: 0"),
    Variable("FP4QUANT_CLUSTER_CODEC_BPS", "cluster", "fp4quant/cluster/rank.py (dilation_from_env)",
             "set by `python -m fp4quant.cluster run` for its ranks only: the dilated target codec's bytes/s; each "
             "codec op is stretched (slept) to at least its target bytes over it; finite, >= 0; unset or 0: off"),
    Variable("CUOBJDUMP", "build", "scripts/sass_report.py",
             "the cuobjdump that reads the kernels' SASS (default: PATH, beside nvcc, pip's nvidia-cuda-cuobjdump)"),
    Variable("XDG_CACHE_HOME", "tests", "scripts/sass_report.py",
             "where the CUDA toolchain tests keep their CUDA-torch venv (default ~/.cache): the SASS report looks "
             "there for a cuobjdump"),
    Variable("FP4QUANT_TEST_BACKEND", "tests", "tests/distributed.py -> the rank jobs",
             "set by the test launcher for its ranks: `gloo` or `nccl`"),
)


def current() -> dict[str, str | None]:
    """Each variable's value in this process (None: unset)."""
    return {v.name: os.environ.get(v.name) for v in VARIABLES}


def markdown_table() -> str:
    rows = ["| variable | kind | read by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.kind} | {v.read_by} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(rows) + "\n"
