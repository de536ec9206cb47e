"""Instructions per value of the CUDA quantize kernels' hot loops, from their SASS (sm_90).

    python scripts/sass_report.py [--before REV] [--out data/sass_sm90.txt]

Builds csrc/cuda/*.cu for sm_90 with the extension's nvcc flags (setup.py: -O3 -std=c++17
--fmad=false; no GPU needed), once with `-Xptxas -v` for each kernel's registers, shared memory,
stack and spills, and once as a cubin (`nvcc -cubin -arch=sm_90`) that `cuobjdump -sass`
disassembles.  --before REV does the same for the csrc/ of a git revision (the kernels before a
change) into a second section.

Method (static, no GPU): in the kernel that quantizes each preset and input dtype (for the
presets the compile-time specialized kernels cover, the instance the dispatch picks for whole,
aligned tiles; before them, the runtime-config fast kernel, one instance for every dtype), the
hot loop is the persistent loop over tiles: the backward branch (BRA to a lower address) with the
largest span in the function.  Its static count is every instruction from the branch's target to
the branch, NOPs excluded, each counted once; instructions per value = that count / the values a
thread processes per iteration (16 for the specialized kernels: one micro-group; 8 before).  So:
  - code inside the loop that runs rarely (a non-finite group's fallback, a short rolled loop)
    counts in full, as if it ran every time: an upper bound of the hot path in that respect;
  - code the loop calls (the out-of-line slow paths of IEEE division, CALL.REL) is not counted,
    nor are the instructions before the loop (per-thread constants);
  - a loop nested inside the hot loop counts once, not per trip: the report lists such loops
    (the kernels before the specialization had some on their hot path: their count is a lower
    bound there; the specialized kernels' hot path has none).
These are thread instructions per value, not a time: what the loop issues at best, one
instruction per thread per issue slot.

Tools: nvcc from $CUDA_HOME/bin, PATH or /usr/local/cuda/bin; cuobjdump (and the nvdisasm it
runs) from $CUOBJDUMP, PATH, beside nvcc, pip's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
wheels or triton's copies (site-packages/nvidia/*/bin, site-packages/triton/backends/nvidia/bin),
here or in the CUDA venv that tests/toolchain caches (~/.cache/fp4quant/cuda-venv-*).
Output: a text report (the committed one: data/sass_sm90.txt).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false"]  # setup.py's, less -lineinfo and the gencode list
ARCH = "sm_90"
DTYPES = {0: "float32", 1: "bfloat16", 2: "float16"}
# preset -> (fwht, coarse group, warp packing) of quantize.cu's instances
SPEC_PRESETS = {
    "fp4quant": (1, 1, 1),
    "no_fwht": (0, 1, 1),
    "single_scale": (1, 0, 1),
    "naive_pack": (1, 1, 0),
}
SPEC_KERNEL = re.compile(r"spec_quantize_kernelILi(\d+)ELi(\d)ELb(\d)ELb(\d)ELb(\d)ELb(\d)E")
FAST_KERNEL = re.compile(r"fast_kernelILi(\d)ELb(\d)E")
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P[T\d],\s*)?(?:0x)?([0-9a-f]+)\b")


def site_dirs() -> list[str]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    return list(dict.fromkeys(dirs))


def find_nvcc() -> str:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cands = [os.path.join(home, "bin", "nvcc")] if home else []
    for cand in cands + [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]:
        if cand and os.access(cand, os.X_OK):
            return cand
    sys.exit("sass_report: no nvcc (set CUDA_HOME or put nvcc on PATH)")


def nvcc_bin_dir(nvcc: str) -> str:
    """The bin/ of the toolkit behind nvcc (a wrapper script such as /usr/local/bin/nvcc
    execs the real one: its dry run names the real _HERE_)."""
    out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True)
    m = re.search(r"#\$ _HERE_=(\S+)", out.stdout + out.stderr)
    return m.group(1) if m else os.path.dirname(os.path.realpath(nvcc))


def tool_dirs(nvcc: str) -> list[str]:
    """Folders that may hold cuobjdump and nvdisasm, in the order preferred: the CUDA toolkit's
    beside nvcc, pip's NVIDIA wheels and triton's (triton/backends/nvidia/bin has both) in this
    interpreter's site-packages, then in the CUDA venv that tests/toolchain caches."""
    dirs = [nvcc_bin_dir(nvcc)]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp4quant"
    sites = site_dirs() + sorted(glob.glob(str(cache / "cuda-venv-*" / "lib" / "python3*" / "site-packages")))
    for d in sites:
        dirs += sorted(glob.glob(os.path.join(d, "nvidia", "*", "bin")), reverse=True)
        dirs.append(os.path.join(d, "triton", "backends", "nvidia", "bin"))
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def find_cuobjdump(nvcc: str) -> str:
    """cuobjdump: $CUOBJDUMP, PATH, else the first of tool_dirs() that has it, preferring one
    with nvdisasm beside it (cuobjdump -sass runs nvdisasm)."""
    for cand in (os.environ.get("CUOBJDUMP", ""), shutil.which("cuobjdump") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    found = [os.path.join(d, "cuobjdump") for d in tool_dirs(nvcc) if os.access(os.path.join(d, "cuobjdump"), os.X_OK)]
    paired = [c for c in found if os.access(os.path.join(os.path.dirname(c), "nvdisasm"), os.X_OK)]
    if paired or found:
        return (paired or found)[0]
    sys.exit("sass_report: no cuobjdump (the CUDA toolkit's, or `pip install nvidia-cuda-cuobjdump "
             "nvidia-cuda-nvdisasm`; or set CUOBJDUMP)")


def find_nvdisasm(nvcc: str, cuobjdump: str) -> str | None:
    for d in [os.path.dirname(cuobjdump)] + tool_dirs(nvcc):
        if os.access(os.path.join(d, "nvdisasm"), os.X_OK):
            return os.path.join(d, "nvdisasm")
    return shutil.which("nvdisasm")


def tool_env(cuobjdump: str, nvdisasm: str | None = None) -> dict:
    """cuobjdump runs nvdisasm from PATH: put its folder (and cuobjdump's) first."""
    env = dict(os.environ)
    extra = [os.path.dirname(cuobjdump)] + ([os.path.dirname(nvdisasm)] if nvdisasm else [])
    env["PATH"] = os.pathsep.join(extra + [env.get("PATH", "")])
    return env


def version_line(cmd: list[str], env=None) -> str:
    out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, env=env).stdout
    lines = [line for line in out.splitlines() if "release" in line or line.startswith("Cuda compilation")]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


# ---- building and reading ----------------------------------------------------------------------


@dataclass
class Kernel:
    name: str
    registers: int = 0
    static_smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    instructions: list[tuple[int, str]] = field(default_factory=list)


def build(nvcc: str, cuobjdump: str, csrc: Path, work: Path, sources: list[str] | None = None) -> dict[str, Kernel]:
    """Every kernel of csrc/cuda/*.cu (or of the named sources): ptxas's resource use and the SASS."""
    kernels: dict[str, Kernel] = {}
    env = tool_env(cuobjdump, find_nvdisasm(nvcc, cuobjdump))
    work.mkdir(parents=True, exist_ok=True)
    for cu in sorted((csrc / "cuda").glob("*.cu")):
        if sources is not None and cu.name not in sources:
            continue
        cubin = work / (cu.stem + ".cubin")
        base = [nvcc, *NVCC_FLAGS, f"-arch={ARCH}", f"-I{csrc}"]
        rep = subprocess.run(base + ["-Xptxas", "-v", "-cubin", str(cu), "-o", str(cubin)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if rep.returncode:
            sys.exit(f"sass_report: nvcc failed on {cu}:\n{rep.stdout[-4000:]}")
        current = None
        for line in rep.stdout.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m:
                current = kernels.setdefault(m.group(1), Kernel(m.group(1)))
                continue
            if current is None:
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
            m = re.search(r"Used (\d+) registers", line)
            if m:
                current.registers = int(m.group(1))
                s = re.search(r"(\d+) bytes smem", line)
                current.static_smem = int(s.group(1)) if s else 0
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
        if sass.returncode:
            sys.exit(f"sass_report: cuobjdump failed on {cubin}:\n{sass.stderr[-2000:]}")
        for chunk in re.split(r"\n\s+Function : ", sass.stdout)[1:]:
            name = chunk.split("\n", 1)[0].strip()
            k = kernels.setdefault(name, Kernel(name))
            matches = map(INSTRUCTION.match, chunk.splitlines())
            k.instructions = [(int(m.group(1), 16), m.group(2)) for m in matches if m]
    return kernels


@dataclass
class Loop:
    start: int
    end: int
    count: int
    inner: list[int]  # static sizes of the loops nested inside
    calls: int
    opcodes: collections.Counter


def opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0].split(".")[0]


def hot_loop(k: Kernel) -> Loop:
    """The backward branch with the largest span: the persistent loop over tiles."""
    loops = []
    for addr, text in k.instructions:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    if not loops:
        raise ValueError(f"{k.name}: no loop")
    start, end = max(loops, key=lambda se: se[1] - se[0])

    def size(lo: int, hi: int) -> int:
        return sum(1 for a, t in k.instructions if lo <= a <= hi and not t.startswith("NOP"))

    body = [t for a, t in k.instructions if start <= a <= end and not t.startswith("NOP")]
    nested = sorted({(s, e) for s, e in loops if start <= s and e <= end and (s, e) != (start, end)})
    return Loop(start, end, len(body), [size(s, e) for s, e in nested], sum(1 for t in body if opcode(t) == "CALL"),
                collections.Counter(opcode(t) for t in body))


GROUPS = {
    "fp32": {"FADD", "FMUL", "FFMA", "FMNMX", "FMNMX3", "FSETP", "FSEL", "FCHK", "MUFU"},
    "int/logic": {"IMAD", "IADD3", "IADD", "LOP3", "SHF", "LEA", "VIMNMX", "VIMNMX3", "VIADD", "VIADDMNMX", "ISETP",
                  "SEL", "MOV", "IMNMX", "PRMT", "IABS", "P2R", "R2P", "PLOP3"},
    "convert/const": {"F2F", "F2I", "I2F", "HADD2", "HFMA2", "F2FP"},
    "memory/shuffle": {"LDG", "STG", "LDS", "STS", "LDC", "SHFL", "REDUX", "ATOMS", "ATOMG", "RED"},
    "control/sync": {"BRA", "BAR", "BSSY", "BSYNC", "CALL", "EXIT", "WARPSYNC", "RET"},
}


def group_of(op: str) -> str:
    for group, names in GROUPS.items():
        if op in names:
            return group
    return "uniform/special" if op.startswith(("U", "S2", "CS2")) else "other"


def breakdown(ops: collections.Counter) -> str:
    totals = collections.Counter()
    for op, n in ops.items():
        totals[group_of(op)] += n
    order = list(GROUPS) + ["uniform/special", "other"]
    return ", ".join(f"{g} {totals[g]}" for g in order if totals[g])


# ---- the report ----------------------------------------------------------------------------------


def spec_rows(kernels: dict[str, Kernel]) -> list[tuple[str, str, Kernel, int]]:
    rows = []
    index = {}
    for name, k in kernels.items():
        m = SPEC_KERNEL.search(name)
        if m:
            g, dt, fwht, coarse, warp, safe = map(int, m.groups())
            index[(dt, fwht, coarse, warp, safe)] = k
    for preset, (fwht, coarse, warp) in SPEC_PRESETS.items():
        for dt, dname in DTYPES.items():
            k = index.get((dt, fwht, coarse, warp, 0))
            if k:
                rows.append((preset, dname, k, 16))
    return rows


def fast_rows(kernels: dict[str, Kernel]) -> list[tuple[str, str, Kernel, int]]:
    """Before the specialization: fast.cu's fast_kernel<kModeQuantize, fwht> served the four
    presets for every dtype (dtype, scales and packing decided at run time)."""
    index = {}
    for name, k in kernels.items():
        m = FAST_KERNEL.search(name)
        if m and m.group(1) == "0":
            index[int(m.group(2))] = k
    rows = []
    for preset, (fwht, _, _) in SPEC_PRESETS.items():
        k = index.get(fwht)
        if k:
            rows.append((preset, "any", k, 8))
    return rows


def short(name: str) -> str:
    m = SPEC_KERNEL.search(name)
    if m:
        g, dt, fwht, coarse, warp, safe = m.groups()
        scale = "group" if coarse == "1" else "none"
        return (f"spec_quantize_kernel<G={g}, {DTYPES[int(dt)]}, fwht={fwht}, coarse={scale}, "
                f"{'warp' if warp == '1' else 'naive'}{', safe' if safe == '1' else ''}>")
    m = FAST_KERNEL.search(name)
    if m:
        return f"fast_kernel<mode={m.group(1)}, fwht={m.group(2)}>"
    m = re.search(r"\d+([a-z][a-z_]*_kernel)(?:ILi(\d+)E)?", name)
    return f"{m.group(1)}<{m.group(2)}>" if m and m.group(2) else (m.group(1) if m else name)


def section(title: str, kernels: dict[str, Kernel], rows) -> list[str]:
    out = [title, "=" * len(title), ""]
    out.append(f"{'preset':<13} {'dtype':<9} {'loop':>5} {'values':>6} {'instr/value':>11}  {'regs':>4}  kernel; "
               "loop breakdown; inner loops; calls")
    for preset, dname, k, values in rows:
        loop = hot_loop(k)
        inner = ", ".join(map(str, loop.inner)) or "none"
        out.append(f"{preset:<13} {dname:<9} {loop.count:>5} {values:>6} {loop.count / values:>11.2f}  "
                   f"{k.registers:>4}  {short(k.name)}; {breakdown(loop.opcodes)}; inner loops: {inner}; "
                   f"calls: {loop.calls}")
    out += ["", "ptxas -v (every kernel): registers, static shared memory, stack frame, spill stores/loads", ""]
    for name in sorted(kernels, key=short):
        k = kernels[name]
        if not k.registers and not k.instructions:
            continue
        out.append(f"  {short(name):<78} {k.registers:>3} regs  {k.static_smem:>5} B smem  {k.stack} B stack  "
                   f"{k.spill_stores}/{k.spill_loads} B spills")
    return out + [""]


def git_csrc(rev: str, into: Path) -> Path:
    """csrc/ of git revision rev, extracted under into."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "csrc.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "csrc"], stdout=f, check=True)
    with tarfile.open(archive) as t:
        t.extractall(into, filter="data") if sys.version_info >= (3, 12) else t.extractall(into)
    return into / "csrc"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REV", help="also report the kernels of git revision REV")
    ap.add_argument("--out", type=Path, help="write the report here (else standard output)")
    args = ap.parse_args()
    nvcc = find_nvcc()
    cuobjdump = find_cuobjdump(nvcc)
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "csrc")
    lines = [
        f"SASS report of the CUDA quantize kernels ({ARCH}): scripts/sass_report.py (its docstring states the method)",
        f"nvcc: {version_line([nvcc])} ({nvcc})",
        f"cuobjdump: {version_line([cuobjdump])}",
        f"flags: {' '.join(NVCC_FLAGS)} -arch={ARCH} -cubin",
        f"csrc at {rev}{' with uncommitted changes' if dirty else ''}",
        "",
        "instr/value = static instructions of the hot loop / values a thread processes per iteration.",
        "Dynamic shared memory per block (not in ptxas's figure): spec_quantize_kernel 9248 B (2048 floats",
        "padded + 2 x 4 warp maxima); fast_kernel 9216 B (2048 + 256 floats) for the FWHT, none without.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        after = build(nvcc, cuobjdump, ROOT / "csrc", tmp / "after")
        if args.before:
            old_rev = git("rev-parse", "--short", args.before)
            if not old_rev:
                sys.exit(f"sass_report: no git revision {args.before}")
            old_csrc = git_csrc(old_rev, tmp / "before")
            before = build(nvcc, cuobjdump, old_csrc, tmp / "before_build")
            title = (f"Before: csrc at {old_rev} (the runtime-config fast kernel, one instance for every dtype: "
                     "its static loop holds the code of every config it decides at run time)")
            lines += section(title, before, fast_rows(before))
        lines += section("After: the compile-time specialized kernels (csrc/cuda/quantize.cu)", after, spec_rows(after))
    text = "\n".join(lines)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
