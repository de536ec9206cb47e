"""The CUDA toolchain of this machine as the build sees it: the GPUs and driver that
nvidia-smi lists, the nvcc compilers and their versions, the CUDA version a torch build
was made for, and which combinations of them can build and run fp4quant's CUDA kernels.

Standard library only: scripts/bootstrap.py and setup.py load this file by path, before
torch is installed or importable; the tests and fp4quant.info import it as a module.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The newest CUDA release an NVIDIA driver branch runs (NVIDIA's CUDA toolkit release notes,
# table 3): for nvidia-smi versions that print no "CUDA Version".
DRIVER_BRANCH_CUDA = [(580, (13, 0)), (575, (12, 9)), (570, (12, 8)), (560, (12, 6)), (555, (12, 5)),
                      (550, (12, 4)), (545, (12, 3)), (535, (12, 2)), (530, (12, 1)), (525, (12, 0)),
                      (520, (11, 8)), (450, (11, 0))]


def version_str(v: tuple[int, ...] | None) -> str:
    return ".".join(map(str, v)) if v else "none"


def _run(cmd: list[str], timeout: float = 60, with_stderr: bool = False) -> str | None:
    """stdout (and stderr) of cmd, or None when it cannot run or fails."""
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if with_stderr else subprocess.PIPE,
                             text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


# ---- the GPUs and the driver ------------------------------------------------------------------


@dataclass(frozen=True)
class Gpus:
    """What nvidia-smi lists: the GPUs, the driver and the newest CUDA that driver runs."""

    names: tuple[str, ...]
    driver: str  # e.g. "580.65.06"; "unknown" when nvidia-smi does not say
    driver_cuda: tuple[int, int] | None  # e.g. (13, 0)
    compute_caps: tuple[str, ...] = ()  # e.g. ("9.0",), one per GPU where nvidia-smi says

    def describe(self) -> str:
        names = ", ".join(sorted(set(self.names)))
        return f"{len(self.names)} GPU(s) ({names}), driver {self.driver} (CUDA <= {version_str(self.driver_cuda)})"

    def runs(self, cuda: tuple[int, ...]) -> bool:
        """Whether this driver runs code built with CUDA `cuda`: a driver runs every release of
        its own CUDA major version (minor-version compatibility, CUDA 11 on) and older ones."""
        return self.driver_cuda is not None and self.driver_cuda[0] >= cuda[0]


def driver_branch_cuda(driver: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)", driver)
    if not m:
        return None
    return next((cuda for branch, cuda in DRIVER_BRANCH_CUDA if int(m.group(1)) >= branch), None)


def nvidia_gpus(smi: str | None = None) -> Gpus | None:
    """The GPUs that `nvidia-smi -L` lists, or None where there is no nvidia-smi or it lists none."""
    smi = smi or shutil.which("nvidia-smi")
    listing = _run([smi, "-L"], timeout=30) if smi else None
    names = tuple(m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.*?)(?: \(UUID:.*)?$", listing or "", re.M))
    if not names:
        return None
    query = _run([smi, "--query-gpu=driver_version,compute_cap", "--format=csv,noheader"], timeout=30) or ""
    rows = [[f.strip() for f in line.split(",")] for line in query.splitlines() if line.strip()]
    driver = rows[0][0] if rows and rows[0][0] else "unknown"
    caps = tuple(r[1] for r in rows if len(r) > 1 and re.fullmatch(r"\d+\.\d+", r[1]))
    banner = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", _run([smi], timeout=30) or "")
    cuda = (int(banner.group(1)), int(banner.group(2))) if banner else driver_branch_cuda(driver)
    return Gpus(names, driver, cuda, caps)


# ---- nvcc -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: tuple[int, int, int]
    origin: str  # where it was found: CUDA_HOME, pip, PATH, /usr/local/cuda
    home: str  # the CUDA_HOME it belongs to: the folder above the bin/ it really runs from

    def describe(self) -> str:
        return f"nvcc {version_str(self.version)} ({self.path}, from {self.origin})"


def nvcc_home(path: str) -> str:
    """The CUDA_HOME of an nvcc: where its dry run says it lives (_HERE_, the real bin/ behind a
    wrapper script such as /usr/local/bin/nvcc), else the folder above the bin/ of path."""
    out = _run([path, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], with_stderr=True) or ""
    here = re.search(r"^#\$ _HERE_=(.+)$", out, re.M)
    return str(Path(here.group(1).strip()).parent) if here else str(Path(path).parent.parent)


def nvcc_at(path: str | os.PathLike, origin: str) -> Nvcc | None:
    """The nvcc at path and its version ("release 13.0, V13.0.88"), or None."""
    path = str(path)
    out = _run([path, "--version"]) if os.path.isfile(path) else None
    m = re.search(r"release (\d+)\.(\d+)(?:, V(\d+)\.(\d+)\.(\d+))?", out or "")
    if not m:
        return None
    version = tuple(int(g) for g in m.group(3, 4, 5)) if m.group(3) else (int(m.group(1)), int(m.group(2)), 0)
    return Nvcc(path, version, origin, nvcc_home(path))


def pip_nvccs(site_dirs: list[str]) -> list[str]:
    """nvcc from NVIDIA's pip packages: nvidia/cu13/bin/nvcc (CUDA 13 on), nvidia/cuda_nvcc/bin/nvcc (CUDA 12)."""
    found: list[str] = []
    for site in site_dirs:
        found += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "nvcc")), reverse=True)
    return found


def nvcc_candidates(site_dirs: list[str], env: dict | None = None) -> list[Nvcc]:
    """Every usable nvcc, in the order it is preferred: $CUDA_HOME (or $CUDA_PATH) alone when
    set; otherwise pip's in site_dirs, the one on PATH, /usr/local/cuda's."""
    env = os.environ if env is None else env
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        nvcc = nvcc_at(os.path.join(home, "bin", "nvcc"), "CUDA_HOME")
        return [nvcc] if nvcc else []
    places = [(p, "pip") for p in pip_nvccs(site_dirs)]
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    places += [(on_path, "PATH")] if on_path else []
    places += [("/usr/local/cuda/bin/nvcc", "/usr/local/cuda")]
    found, seen = [], set()
    for path, origin in places:
        nvcc = nvcc_at(path, origin)
        if nvcc and os.path.realpath(nvcc.home) not in seen:
            seen.add(os.path.realpath(nvcc.home))
            found.append(nvcc)
    return found


def matching_nvcc(candidates: list[Nvcc], cuda: tuple[int, ...]) -> Nvcc | None:
    """The first nvcc whose CUDA major version is cuda's (torch refuses any other)."""
    return next((n for n in candidates if n.version[0] == cuda[0]), None)


# ---- torch builds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchBuild:
    """A torch release as the package index describes it (nothing installed)."""

    version: str  # e.g. "2.14.1" or "2.14.1+cu130"
    cuda: tuple[int, int] | None  # None: a CPU build
    requires: tuple[str, ...] = ()
    index_url: str | None = None  # None: the default index

    def describe(self) -> str:
        cuda = f"CUDA {version_str(self.cuda)}" if self.cuda else "CPU only"
        return f"torch {self.version} ({cuda})"


_RUNTIME_REQ = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(?:-cu\d+)?)\s*(\[[^\]]*\])?\s*==\s*(\d+)\.(\d+)([\d.]*)")


def torch_build(version: str, requires: list[str] | tuple[str, ...], index_url: str | None = None) -> TorchBuild:
    """The CUDA version of a torch wheel: its local tag (+cu130) or the CUDA runtime it requires
    (cuda-toolkit==13.0.3, nvidia-cuda-runtime-cu12==12.8.90); neither: a CPU build."""
    reqs = tuple(r for r in requires if "extra ==" not in r)
    tag = re.search(r"\+cu(\d+)(\d)$", version)
    cuda = (int(tag.group(1)), int(tag.group(2))) if tag else None
    for r in reqs:
        m = _RUNTIME_REQ.match(r)
        if m and cuda is None:
            cuda = (int(m.group(3)), int(m.group(4)))
    return TorchBuild(version, cuda, reqs, index_url)


def pip_nvcc_requirements(build: TorchBuild) -> list[str]:
    """The pip requirement of the nvcc that matches a CUDA build of torch, with the CUDA runtime
    headers and library: cuda-toolkit[nvcc,cudart] at torch's own cuda-toolkit version where torch
    requires one (CUDA 13 on), else NVIDIA's per-component wheels of torch's CUDA minor release."""
    assert build.cuda is not None
    for r in build.requires:
        m = _RUNTIME_REQ.match(r)
        if m and m.group(1) == "cuda-toolkit":
            return [f"cuda-toolkit[nvcc,cudart]=={m.group(3)}.{m.group(4)}{m.group(5)}"]
    major, minor = build.cuda
    if major >= 13:
        return [f"cuda-toolkit[nvcc,cudart]=={major}.{minor}.*"]
    return [f"nvidia-cuda-nvcc-cu{major}=={major}.{minor}.*", f"nvidia-cuda-runtime-cu{major}=={major}.{minor}.*"]


# ---- GPU architectures ------------------------------------------------------------------------

DEFAULT_ARCHS = "8.0;9.0"  # A100 and H100/H200; PTX of the highest runs on newer GPUs
_ARCH = re.compile(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?([af]?)(\+ptx)?", re.I)
ARCH_SPELLINGS = "e.g. 9.0, 90, 90a, sm_90, 8.0;9.0, 80,90 or 8.0 9.0+PTX"


class ArchError(ValueError):
    pass


@dataclass(frozen=True)
class Archs:
    """GPU targets: cubins for each of `cubins`, PTX for each of `ptx` (names like "90", "90a")."""

    cubins: tuple[str, ...]
    ptx: tuple[str, ...]

    def gencode_flags(self) -> list[str]:
        flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in self.cubins]
        return flags + [f"-gencode=arch=compute_{a},code=compute_{a}" for a in self.ptx]

    def spelling(self) -> str:
        """Like TORCH_CUDA_ARCH_LIST: "80;90+PTX"."""
        return ";".join(a + ("+PTX" if a in self.ptx else "") for a in self.cubins)


def _arch_key(arch: str) -> tuple[int, str]:
    return int(arch.rstrip("af")), arch[-1] if arch[-1] in "af" else ""


def parse_archs(spec: str) -> tuple[list[str], list[str]]:
    """FP4QUANT_CUDA_ARCHS as TORCH_CUDA_ARCH_LIST spells it -> (archs, archs marked +PTX), sorted."""
    archs, marked = set(), set()
    for token in filter(None, re.split(r"[;,\s]+", spec.strip())):
        m = _ARCH.fullmatch(token)
        if not m or (m.group(2) is None and len(m.group(1)) < 2):
            raise ArchError(f"FP4QUANT_CUDA_ARCHS={spec!r}: cannot read {token!r} as a GPU architecture "
                            f"({ARCH_SPELLINGS})")
        arch = m.group(1) + (m.group(2) or "") + m.group(3).lower()
        archs.add(arch)
        if m.group(4):
            marked.add(arch)
    if not archs:
        raise ArchError(f"FP4QUANT_CUDA_ARCHS={spec!r} names no GPU architecture ({ARCH_SPELLINGS})")
    return sorted(archs, key=_arch_key), sorted(marked, key=_arch_key)


def choose_archs(spec: str | None, supported: set[str], local_caps: tuple[str, ...] = ()) -> tuple[Archs, list[str]]:
    """The targets to build: spec (default DEFAULT_ARCHS plus the GPUs of this machine), less
    those this nvcc cannot target (`supported`: its --list-gpu-arch numbers; empty: unknown);
    PTX for the highest (its portable form: 90a -> 90) and any marked +PTX.
    Returns (targets, the archs dropped)."""
    wanted, marked = parse_archs(spec if spec is not None else ";".join([DEFAULT_ARCHS, *local_caps]))
    keep = [a for a in wanted if not supported or a.rstrip("af") in supported]
    dropped = [a for a in wanted if a not in keep]
    if not keep:
        raise ArchError(f"this nvcc cannot build for any of {wanted} (it supports {sorted(supported, key=int)})")
    ptx = {keep[-1].rstrip("af")} | {a for a in marked if a in keep}
    return Archs(tuple(keep), tuple(sorted(ptx, key=_arch_key))), dropped


def nvcc_archs(nvcc: str) -> set[str]:
    """The architectures nvcc can target ("90", "100", ...); empty when it does not say."""
    out = _run([nvcc, "--list-gpu-arch"]) or ""
    return {tok.split("_", 1)[1] for tok in out.split() if tok.startswith("compute_")}


# ---- what setup.py builds ---------------------------------------------------------------------


class BuildError(Exception):
    """A build that cannot give what this machine needs; the message (one line) says what to do."""


def build_nvcc(torch_version: str, torch_cuda: str | None, gpus: Gpus | None, found: list[Nvcc],
               env: dict | None = None) -> Nvcc | None:
    """The nvcc that compiles the CUDA kernels, or None to build the CPU kernels alone: where
    FP4QUANT_CPU_ONLY=1, or where neither a GPU nor an nvcc is here.  Raises BuildError where a GPU
    is here but the build would have no CUDA kernels, or where the nvcc found cannot build for
    torch (another CUDA major version: torch's cpp_extension refuses it only after the
    dependencies are installed, with a cryptic message)."""
    env = os.environ if env is None else env
    if env.get("FP4QUANT_CPU_ONLY") == "1":
        return None
    opt_out = "or set FP4QUANT_CPU_ONLY=1 to build without CUDA kernels"
    if not torch_cuda:
        if gpus:
            raise BuildError(f"this machine has {gpus.describe()} but torch {torch_version} is a CPU build, so fp4quant "
                             f"would have no CUDA kernels: install a CUDA build of torch (`make setup` picks one the "
                             f"driver runs) {opt_out}")
        return None
    cuda = tuple(int(x) for x in torch_cuda.split("."))
    nvcc = matching_nvcc(found, cuda)
    if nvcc:
        return nvcc
    pip_nvcc = " or ".join(f"pip install '{r}'" for r in pip_nvcc_requirements(TorchBuild(torch_version, cuda)))
    advice = (f"install nvcc for CUDA {cuda[0]} into this environment ({pip_nvcc}; the build finds it there) or set "
              f"CUDA_HOME to a CUDA {cuda[0]}.x toolkit, {opt_out}")
    if found:
        raise BuildError(f"{'; '.join(n.describe() for n in found)} cannot build for torch {torch_version} (CUDA "
                         f"{torch_cuda}): the CUDA major versions differ, which torch refuses; {advice}")
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        raise BuildError(f"CUDA_HOME={home} has no working bin/nvcc; {advice}")
    if gpus:
        raise BuildError(f"this machine has {gpus.describe()} but no nvcc was found (no CUDA_HOME, none from pip in this "
                         f"environment, none on PATH or in /usr/local/cuda), so fp4quant would have no CUDA kernels; {advice}")
    return None


def cudart_paths(home: str, link_dir: Path) -> tuple[list[str], list[str]]:
    """(include folders, library folders) that the CUDA runtime needs beyond the ones torch adds
    (CUDA_HOME/include, and CUDA_HOME/lib64 or else lib).  A toolkit needs none.  conda-forge's
    keeps the headers in CUDA_HOME/targets/<platform>/include; CUDA 12's pip wheels keep the
    runtime in a sibling package (nvidia/cuda_runtime); NVIDIA's pip wheels ship only
    libcudart.so.N, which `-lcudart` (torch's CUDAExtension adds it) cannot find: link_dir then
    gets a libcudart.so pointing at it."""
    base = Path(home)
    roots = [base, *sorted(base.glob("targets/*")), *sorted(base.parent.glob("cuda_runtime"))]
    includes = [] if (base / "include" / "cuda_runtime.h").exists() else [
        str(r / "include") for r in roots[1:] if (r / "include" / "cuda_runtime.h").exists()][:1]
    torch_lib = base / ("lib64" if (base / "lib64").exists() else "lib")
    libs = [r / d for r in roots for d in ("lib64", "lib")]
    for lib in libs:
        if (lib / "libcudart.so").exists():
            return includes, ([] if lib == torch_lib else [str(lib)])
    versioned = sorted(p for lib in libs for p in lib.glob("libcudart.so.[0-9]*"))
    if not versioned:
        raise BuildError(f"the CUDA runtime library (libcudart.so) is missing beside nvcc in {home}: install the CUDA "
                         "runtime of nvcc's version (pip install 'cuda-toolkit[cudart]==X.Y.*') or set CUDA_HOME to a "
                         "full toolkit")
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libcudart.so"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(versioned[0])
    return includes, [str(link_dir)]


@dataclass(frozen=True)
class OpenMP:
    """The OpenMP runtime that torch's CPU library loads, which the extension links too: one
    runtime, one thread pool, sized by torch.set_num_threads."""

    library: Path

    def compile_flags(self) -> list[str]:
        return ["-fopenmp"]

    def link_flags(self) -> list[str]:
        # that file by name (not the compiler's own libgomp), found at run time beside torch's
        folder = str(self.library.parent)
        return [f"-L{folder}", f"-l:{self.library.name}", f"-Wl,-rpath,{folder}"]


_OPENMP_NAMES = ("libgomp*.so*", "libomp*.so*", "libiomp5*.so*")


def torch_openmp(torch_dir: str | os.PathLike) -> OpenMP | None:
    """torch's OpenMP runtime: the one its wheel ships in torch/lib or (renamed by auditwheel)
    in the sibling torch.libs, or None when torch ships none."""
    root = Path(torch_dir)
    for folder in (root / "lib", root.parent / "torch.libs"):
        for pattern in _OPENMP_NAMES:
            found = sorted(p for p in folder.glob(pattern) if p.is_file())
            if found:
                return OpenMP(found[0])
    return None
