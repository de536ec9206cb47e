"""Helpers shared by the tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import pytest
import torch

from fp4quant import toolchain

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def nmse(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Normalized mean squared error, in float64."""
    a, e = approx.double(), exact.double()
    return float(((a - e) ** 2).sum() / (e**2).sum().clamp_min(1e-300))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, except that any NaN equals any NaN (payloads are not part of the format)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    itype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a.masked_fill(nan_a, 0).view(itype), b.masked_fill(nan_b, 0).view(itype))


# QuantConfig fields beyond the presets that every implementation is checked on
CONFIG_VARIANTS = [
    {"scale_round": "up"},
    {"group": 16},
    {"group": 128},  # odd power of two: 1/sqrt(128) is inexact
    {"group": 8192},  # the CUDA fast kernel's largest tile (1024 threads)
    {"group": 16384},  # CUDA generic kernel, shared memory past 48 KB
    {"group": 65536},  # CUDA generic kernel, tile staged in global memory
    {"fwht_seed": None},
    {"coarse_scale": "tensor"},  # tensor scale with the FWHT: the workspace pre-pass
    {"coarse_scale": "none", "fwht": "none"},
    {"micro_group": 32, "group": 1024},
    {"micro_group": 2, "group": 64},
    {"element": "int4", "micro_scale": "e4m3"},
    {"element": "e4m3", "micro_scale": "e4m3"},
    {"micro_scale": "e8m0", "coarse_scale": "none", "scale_round": "up"},
    {"micro_scale": "fp16", "coarse_scale": "none", "scale_round": "up"},
    {"micro_scale": "none", "coarse_scale": "tensor"},
]


def variant_id(d: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in d.items())


def cuda_verdict(gpus: toolchain.Gpus | None, torch_sees_gpu: bool, no_kernels: str | None = None):
    """What a CUDA test does on this machine: None (run it), ("skip", why) where there is no GPU,
    ("fail", why) where there is one (nvidia-smi lists it, or torch sees it) that torch or
    fp4quant's extension cannot use: a GPU machine must test its GPU, not report green skips."""
    if gpus is None and not torch_sees_gpu:
        return "skip", "no NVIDIA GPU here (nvidia-smi lists none)"
    listed = gpus.describe() if gpus else "a GPU"
    if not torch_sees_gpu:
        if not torch.version.cuda:
            why = f"torch {torch.__version__} is a CPU build"
        else:
            why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use it: torch.cuda.is_available() is False"
            if gpus and gpus.driver_cuda and not gpus.runs(tuple(int(x) for x in torch.version.cuda.split("."))):
                why += f"; the driver runs CUDA <= {toolchain.version_str(gpus.driver_cuda)} only"
        return "fail", f"nvidia-smi lists {listed} but {why} (rerun `make setup`: it installs a torch the driver runs)"
    if no_kernels:
        return "fail", f"this machine has {listed} but fp4quant's CUDA kernels are not in use: {no_kernels}"
    return None


def obey(verdict) -> None:
    if verdict is not None:
        (pytest.skip if verdict[0] == "skip" else pytest.fail)(verdict[1])
