"""What fp4quant was built with and what it uses: `python -m fp4quant.info [--json]`."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from . import __version__, environment, ops, toolchain
from .provenance import git_commit, hardware


def info() -> dict:
    module, built_with, unavailable_reason = ops.extension()
    gpu = torch.cuda.is_available()
    listed = toolchain.nvidia_gpus()
    return {
        "fp4quant": __version__,
        "commit": git_commit(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "hardware": hardware("cuda" if gpu else None),
        "nvidia_smi": listed.describe() if listed else None,
        "extension": {
            "loaded": module is not None,
            "path": getattr(module, "__file__", None),
            "unavailable_reason": unavailable_reason,
            "built_with": built_with,
            "cpu_kernels": module.cpu_isa() if module is not None else None,
            "cuda_kernels": bool(module.with_cuda) if module is not None else False,
            "cuda_archs": module.cuda_archs if module is not None else "",
        },
        "backend": {"cpu": ops.backend("cpu"), "cuda": ops.backend("cuda") if gpu else "no GPU"},
        "environment": environment.current(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    d = info()
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    ext = d["extension"]
    print(f"fp4quant {d['fp4quant']} (commit {d['commit']})")
    print(f"torch {d['torch']}, CUDA {d['torch_cuda'] or 'none'}; hardware: {d['hardware']}")
    print(f"nvidia-smi: {d['nvidia_smi'] or 'no GPU listed'}")
    if ext["loaded"]:
        built = ext["built_with"]
        nvcc = built.get("nvcc")
        cuda = (f"nvcc {nvcc['version']} ({nvcc['path']}), cubins sm_{', sm_'.join(built['cuda_archs'])}, "
                f"PTX compute_{', compute_'.join(built['ptx_archs'])}") if nvcc else "no CUDA kernels"
        print(f"extension: {ext['path']}")
        print(f"  built for torch {built.get('torch')}: {cuda}")
        print(f"  CPU kernels in use: {ext['cpu_kernels']}; CUDA kernels: {'yes' if ext['cuda_kernels'] else 'no'}")
    else:
        print(f"extension: not in use ({ext['unavailable_reason']})")
    print(f"ops run on: cpu={d['backend']['cpu']}, cuda={d['backend']['cuda']}")
    print("environment variables (docs/environment.md; none changes what a run computes):")
    for v in environment.VARIABLES:
        value = d["environment"][v.name]
        print(f"  {v.name:22s} {v.kind:10s} {'(unset)' if value is None else repr(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
