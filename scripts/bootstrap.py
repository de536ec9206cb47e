"""Create the project's virtual environment and install the package with its test dependencies.

Called by `make` when the dependency files change; standard library only.

- No NVIDIA GPU (nvidia-smi lists none), or FP4QUANT_CPU_ONLY=1: torch is the CPU wheel
  2.13.0 when that wheel can be had without downloading (pip's find-links), else left to pip.
- A GPU: a CUDA build of torch that the driver runs (pip's default torch, else the newest build
  on PyTorch's index for a CUDA the driver runs), and an nvcc of torch's CUDA major version:
  the system's (CUDA_HOME, PATH, /usr/local/cuda), else NVIDIA's pip nvcc of torch's CUDA
  release, installed into the venv, where setup.py finds it.  All of it is decided from the
  package index's metadata before anything heavy is installed; when no combination works, one
  line names the driver, nvcc and torch and what to install.
- FP4QUANT_TORCH: the torch to install instead, as pip arguments
  (e.g. "torch==2.14.1" or "torch --index-url https://download.pytorch.org/whl/cu126").
- --dry-run: print the plan as JSON and stop (after creating the venv, nothing installed in it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_TORCH = "torch==2.13.0"
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
# PyTorch's per-CUDA indexes, newest first: where a torch for an older driver comes from
CUDA_VARIANTS = ["cu130", "cu129", "cu128", "cu126", "cu124", "cu121", "cu118"]


# fp4quant/toolchain.py by path: the package itself cannot be imported before torch and the build
_spec = importlib.util.spec_from_file_location("fp4quant_toolchain", ROOT / "fp4quant" / "toolchain.py")
toolchain = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toolchain)


class NoCombination(Exception):
    """No torch, driver and nvcc that work together: the message says what to install."""


@dataclasses.dataclass
class Plan:
    torch_args: list[str]  # pip arguments that install the chosen torch
    build: object  # toolchain.TorchBuild
    nvcc: object | None  # toolchain.Nvcc of the system, or None
    pip_nvcc: list[str]  # pip requirements of NVIDIA's nvcc, when no system nvcc matches

    def describe(self) -> str:
        nvcc = self.nvcc.describe() if self.nvcc else f"pip's nvcc ({' '.join(self.pip_nvcc)})" if self.pip_nvcc else "none"
        return f"{self.build.describe()} [{' '.join(self.torch_args)}] with {nvcc}"


def run(*cmd: str, env: dict | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def cpu_wheel_on_disk(pip: list[str]) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            [*pip, "download", "--quiet", "--no-index", "--no-deps", "-d", tmp, CPU_TORCH],
            capture_output=True,
        )
        return probe.returncode == 0


def resolve_torch(pip: list[str], torch_args: list[str]):
    """The torch that `pip install <torch_args>` would install (a TorchBuild), from the index's
    metadata: nothing is installed.  None when pip finds none."""
    index = next((torch_args[i + 1] for i, a in enumerate(torch_args[:-1]) if a == "--index-url"), None)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        proc = subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet", "--retries",
                               "1", "--timeout", "30", "--report", str(report), *torch_args],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not report.exists():
            return None
        items = [i for i in json.loads(report.read_text()).get("install", []) if i["metadata"]["name"] == "torch"]
    # pip falls back to other configured indexes when the one asked for is unreachable
    if not items or (index and not items[0]["download_info"]["url"].startswith(index.rstrip("/") + "/")):
        return None
    meta = items[0]["metadata"]
    return toolchain.torch_build(meta["version"], meta.get("requires_dist") or [], index)


def resolvable(pip: list[str], requirements: list[str]) -> bool:
    proc = subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--quiet", *requirements],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode == 0


def torch_choices(pip: list[str], gpus, explicit: list[str] | None) -> Iterator[tuple[list[str], object]]:
    """(pip arguments, TorchBuild or None) in order of preference: FP4QUANT_TORCH alone when set;
    else pip's default torch, then PyTorch's index for each CUDA the driver runs, newest first."""
    if explicit:
        yield explicit, resolve_torch(pip, explicit)
        return
    yield ["torch"], resolve_torch(pip, ["torch"])
    for tag in CUDA_VARIANTS:
        if gpus.runs((int(tag[2:-1]), int(tag[-1]))):
            args = ["torch", "--index-url", PYTORCH_INDEX + tag]
            yield args, resolve_torch(pip, args)


def pinned(torch_args: list[str], version: str) -> list[str]:
    """torch_args with its torch requirement pinned to the version resolved (what was checked is what installs)."""
    i = next(i for i, a in enumerate(torch_args) if re.match(r"torch($|[^\w-])", a))
    return [*torch_args[:i], f"torch=={version}", *torch_args[i + 1:]]


def min_driver(cuda_major: int) -> str:
    branches = [b for b, cuda in toolchain.DRIVER_BRANCH_CUDA if cuda[0] == cuda_major]
    return f"R{min(branches)}+" if branches else f"a driver for CUDA {cuda_major}"


def plan_gpu(gpus, system_nvccs: list, choices: Iterator[tuple[list[str], object]],
             nvcc_resolvable: Callable[[list[str]], bool], explicit: bool = False) -> Plan:
    """The torch and nvcc to install on a machine with GPUs, or NoCombination saying why none works."""
    nvccs = "; ".join(n.describe() for n in system_nvccs) or "no nvcc (CUDA_HOME unset, none on PATH or in /usr/local/cuda)"
    tried: list[str] = []
    missing: list[str] = []  # where pip found no torch
    for args, build in choices:
        if build is None:
            index = args[args.index("--index-url") + 1] if "--index-url" in args else "the default index"
            missing.append(index.replace(PYTORCH_INDEX, "PyTorch's "))
            continue
        if build.cuda is None:
            tried.append(f"{build.describe()} has no CUDA")
            continue
        if not gpus.runs(build.cuda):
            tried.append(f"{build.describe()} needs a driver for CUDA {build.cuda[0]} ({min_driver(build.cuda[0])})")
            continue
        nvcc = toolchain.matching_nvcc(system_nvccs, build.cuda)
        if nvcc:
            return Plan(args, build, nvcc, [])
        pip_nvcc = toolchain.pip_nvcc_requirements(build)
        if nvcc_resolvable(pip_nvcc):
            return Plan(args, build, None, pip_nvcc)
        tried.append(f"{build.describe()} needs nvcc {build.cuda[0]}.x, and pip finds no {' '.join(pip_nvcc)}")
    if missing:
        tried.append(f"no torch for this Python from {', '.join(missing)} (or unreachable)")
    source = "FP4QUANT_TORCH" if explicit else "pip and PyTorch's index"
    raise NoCombination(
        f"fp4quant: no torch build fits this machine: {gpus.describe()}; {nvccs}; from {source}: {'; '.join(tried)}. "
        f"Install an NVIDIA driver for torch's CUDA (R580+ for CUDA 13), or a CUDA toolkit whose nvcc matches torch's "
        f"CUDA major version (then CUDA_HOME=its folder), or choose a torch with FP4QUANT_TORCH='torch==VERSION "
        f"--index-url {PYTORCH_INDEX}cuXYZ'; FP4QUANT_CPU_ONLY=1 builds without CUDA kernels")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--extras", default="dev")
    ap.add_argument("--dry-run", action="store_true", help="print the plan as JSON; install nothing")
    args = ap.parse_args()
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    if not py.exists():
        run(sys.executable, "-m", "venv", str(venv))
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    explicit = shlex.split(os.environ.get("FP4QUANT_TORCH", "")) or None
    gpus = None if os.environ.get("FP4QUANT_CPU_ONLY") == "1" else toolchain.nvidia_gpus()
    plan = None
    if gpus:
        try:
            plan = plan_gpu(gpus, toolchain.nvcc_candidates([]), torch_choices(pip, gpus, explicit),
                            lambda reqs: resolvable(pip, reqs), explicit=bool(explicit))
        except NoCombination as exc:
            print(exc, file=sys.stderr)
            return 1
        torch_args = pinned(plan.torch_args, plan.build.version)
        print(f"fp4quant: {gpus.describe()}: installing {plan.describe()}", flush=True)
    else:
        torch_args = explicit or ([CPU_TORCH] if cpu_wheel_on_disk(pip) else ["torch>=2.4"])
    if args.dry_run:
        print(json.dumps({"gpus": dataclasses.asdict(gpus) if gpus else None, "torch_args": torch_args,
                          "torch": {"version": plan.build.version, "cuda": plan.build.cuda} if plan else None,
                          "nvcc": dataclasses.asdict(plan.nvcc) if plan and plan.nvcc else None,
                          "pip_nvcc": plan.pip_nvcc if plan else []}, indent=2))
        return 0
    run(*pip, "install", "--quiet", "setuptools>=64", "wheel", "ninja")
    run(*pip, "install", "--quiet", *torch_args)
    if plan and plan.pip_nvcc:
        run(*pip, "install", "--quiet", *plan.pip_nvcc)
    run(*pip, "install", "--quiet", "--no-build-isolation", "-e", f".[{args.extras}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
