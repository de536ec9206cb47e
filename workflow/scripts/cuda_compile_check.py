"""Compile every csrc/cuda/*.cu for sm_90 with nvcc, or say that nvcc is missing; write a report.

    python workflow/scripts/cuda_compile_check.py REPORT
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fp4quant.provenance import atomic_write_text


def main() -> int:
    report = sys.argv[1]
    nvcc = shutil.which("nvcc")
    sources = sorted(Path("csrc/cuda").glob("*.cu"))
    if nvcc is None:
        atomic_write_text(report, "nvcc not found: the CUDA kernels were not compile-checked on this machine\n")
        return 0
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    lines, failed = [f"{version}"], False
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            cmd = [nvcc, "-std=c++17", "--fmad=false", "-arch=sm_90", "-Icsrc", "-c", str(src), "-o", f"{tmp}/{src.stem}.o"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            lines.append(f"{src}: {'ok' if r.returncode == 0 else 'FAILED'}")
            if r.returncode:
                failed = True
                lines.append(r.stderr[-4000:])
    atomic_write_text(report, "\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
