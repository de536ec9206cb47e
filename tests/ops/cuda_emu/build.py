"""Build the CPU emulation of the CUDA kernels (csrc/cuda/*.cu) with the harness beside this file.

    python tests/ops/cuda_emu/build.py OUT_DIR [--sanitize address|thread] [--run quick|full]

The .cu files are compiled as C++20 against include/cuda_runtime.h (a CPU stand-in);
two textual rewrites make them plain C++: the dynamic shared-memory declaration becomes
the emulator's per-block buffer, and `kernel<<<grid, block, smem, stream>>>(args)`
becomes `emu::launch(kernel, grid, block, smem, stream, args)`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CSRC = ROOT / "csrc"

_SMEM = re.compile(r"extern __shared__ __align__\(\d+\) float (\w+)\[\];")
_LAUNCH = re.compile(r"([\w:]+(?:<[^;<>]*>)?)<<<([^;]*?)>>>\(([^;]*)\);")


def translate(source: str) -> str:
    source = _SMEM.sub(r"float* \1 = reinterpret_cast<float*>(emu::block->smem);", source)
    return _LAUNCH.sub(r"emu::launch(\1, \2, \3);", source)


def build(out_dir: Path, sanitize: str | None = None, cxx: str | None = None) -> Path:
    """Compile the emulated kernels, the CPU codec and the harness; return the executable."""
    cxx = cxx or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found")
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = []
    for cu in sorted((CSRC / "cuda").glob("*.cu")):
        cpp = out_dir / (cu.stem + "_emu.cpp")
        text = translate(cu.read_text())
        if "<<<" in text:
            raise RuntimeError(f"{cu.name}: a kernel launch the emulator's rewrite does not understand")
        cpp.write_text(text)
        sources.append(str(cpp))
    exe = out_dir / "harness"
    flags = ["-std=c++20", "-O1", "-g", "-ffp-contract=off", "-fno-fast-math", "-pthread"]
    # the fibers switch with _longjmp onto stacks below the scheduler's, which _FORTIFY_SOURCE's
    # __longjmp_chk (on by default in some distributions' compilers) takes for a corrupt stack
    flags += ["-U_FORTIFY_SOURCE"]
    flags += ["-Wall", "-Wno-unused-function"]
    if sanitize:  # the sanitizers want real threads, not fibers
        flags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-DEMU_THREADS"]
        if sanitize == "address":
            flags += ["-fsanitize=undefined", "-fno-sanitize-recover=undefined"]
    cmd = [
        cxx,
        *flags,
        f"-I{HERE / 'include'}",
        f"-I{CSRC}",
        f"-I{CSRC / 'cuda'}",
        str(HERE / "harness.cpp"),
        *sources,
        str(CSRC / "cpu" / "codec_scalar.cpp"),
        "-o",
        str(exe),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"emulator build failed:\n{' '.join(cmd)}\n{proc.stderr[:8000]}")
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--sanitize", choices=["address", "thread"])
    ap.add_argument("--run", choices=["quick", "full"])
    ap.add_argument("--seed", default="1")
    args = ap.parse_args()
    exe = build(args.out_dir, args.sanitize)
    print(exe)
    if args.run:
        return subprocess.run([str(exe), args.run, args.seed]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
