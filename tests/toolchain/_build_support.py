"""Support of the build tests: copies of the sources, running setup.py on them, and a virtual
environment with the CUDA build of torch that scripts/bootstrap.py installs on a GPU machine.

That venv is kept in the user's cache (outside the repository) and reused while that torch's
version is unchanged, so a machine without a GPU can build and inspect fp4quant's CUDA kernels.
It is created on first use (5.4 GB: about 2.5 minutes from a local wheel cache, longer over the
network); the venvs of other torch versions are removed then.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fp4quant import toolchain

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp4quant"
# what nvidia-smi says on an H100 node with NVIDIA's current datacenter driver (R580: CUDA 13.0)
H100 = toolchain.Gpus(("NVIDIA H100 80GB HBM3",), "580.65.06", (13, 0), ("9.0",))
MARKER = ".fp4quant-complete"
# the environment a test build starts from: what the test sets, not what the caller's shell had
BUILD_ENV_OFF = ("CUDA_HOME", "CUDA_PATH", "FP4QUANT_CPU_ONLY", "FP4QUANT_CUDA_ARCHS", "FP4QUANT_NO_EXT",
                 "FP4QUANT_BACKEND", "FP4QUANT_TORCH")


def load_bootstrap():
    spec = importlib.util.spec_from_file_location("fp4quant_bootstrap", ROOT / "scripts" / "bootstrap.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def gpu_plan(gpus: toolchain.Gpus = H100):
    """The torch and nvcc that scripts/bootstrap.py picks on a machine with `gpus` and this machine's nvcc."""
    bootstrap = load_bootstrap()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    return bootstrap.plan_gpu(gpus, toolchain.nvcc_candidates([]), bootstrap.torch_choices(pip, gpus, None),
                              lambda reqs: bootstrap.resolvable(pip, reqs)), bootstrap


def cuda_venv() -> tuple[Path, dict]:
    """(venv folder, what it holds): torch as the bootstrap picks it for an H100, the nvcc that
    matches it from pip (cuda-toolkit[nvcc,cudart]), cuobjdump, and the build tools."""
    plan, bootstrap = gpu_plan()
    major, minor = plan.build.cuda
    venv = CACHE / f"cuda-venv-{plan.build.version}-cu{major}{minor}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "cuda-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one creator at a time; the others wait, then reuse it
        if not (venv / MARKER).exists():
            t0 = time.monotonic()
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
            subprocess.run([*pip, "setuptools>=64", "wheel", "ninja", "numpy"], check=True)
            subprocess.run([*pip, *bootstrap.pinned(plan.torch_args, plan.build.version)], check=True)
            subprocess.run([*pip, *toolchain.pip_nvcc_requirements(plan.build), f"nvidia-cuda-cuobjdump=={major}.*"],
                           check=True)
            held = {"torch": plan.build.version, "torch_cuda": list(plan.build.cuda), "torch_args": plan.torch_args,
                    "seconds_to_create": round(time.monotonic() - t0, 1)}
            (venv / MARKER).write_text(json.dumps(held, indent=2) + "\n")
            for stale in CACHE.glob("cuda-venv-*"):
                if stale != venv and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
    return venv, json.loads((venv / MARKER).read_text())


def copy_sources(dest: Path) -> Path:
    """The files setup.py builds from, without any build of this checkout (library, record)."""
    skip = shutil.ignore_patterns("*.so", "_build_info.json", "__pycache__", "*.egg-info")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("csrc", "fp4quant"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def cuobjdump(home: str | None, site: Path) -> str | None:
    """A cuobjdump: the toolkit's beside nvcc, pip's (nvidia-cuda-cuobjdump), triton's."""
    places = [Path(home) / "bin" / "cuobjdump"] if home else []
    places += sorted(site.glob("nvidia/*/bin/cuobjdump")) + [site / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump"]
    return next((str(p) for p in places if p.is_file()), None)


def clean_env(**updates: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in BUILD_ENV_OFF}
    env.setdefault("MAX_JOBS", "2")
    return {**env, **updates}


def setup_py(src: Path, python: str | Path, *args: str, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "setup.py", *args], cwd=src, env=env, capture_output=True, text=True,
                          timeout=timeout)


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""
