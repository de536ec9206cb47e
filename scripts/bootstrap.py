"""Create the project's virtual environment and install the package with its test dependencies.

Called by `make` when the dependency files change; stdlib only.  On a machine with
no NVIDIA GPU, torch is pinned to the CPU wheel 2.13.0 when that wheel can be had
without downloading (pip's find-links); elsewhere torch is left to pip (torch>=2.4).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CPU_TORCH = "torch==2.13.0"


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return out.returncode == 0 and "GPU" in out.stdout


def cpu_wheel_on_disk(pip: list[str]) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            [*pip, "download", "--quiet", "--no-index", "--no-deps", "-d", tmp, CPU_TORCH],
            capture_output=True,
        )
        return probe.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--extras", default="dev")
    args = ap.parse_args()
    venv = Path(args.venv)
    py = venv / "bin" / "python"
    if not py.exists():
        run(sys.executable, "-m", "venv", str(venv))
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    run(*pip, "install", "--quiet", "setuptools>=64", "wheel", "ninja")
    if os.environ.get("FP4QUANT_TORCH"):
        torch_spec = os.environ["FP4QUANT_TORCH"]
    elif not has_nvidia_gpu() and cpu_wheel_on_disk(pip):
        torch_spec = CPU_TORCH
    else:
        torch_spec = "torch>=2.4"
    run(*pip, "install", "--quiet", torch_spec)
    run(*pip, "install", "--quiet", "--no-build-isolation", "-e", f".[{args.extras}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
