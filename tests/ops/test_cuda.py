"""The CUDA kernels (csrc/cuda): they compile, and they give the reference's bytes and values.

Three layers, so that most of it runs without a GPU:
- every .cu file compiles for sm_90 with nvcc, standalone (skipped without nvcc); the fast and
  specialized kernels keep their values in registers (no local-memory spills); the bits do not
  depend on --fmad: the device code's float arithmetic is all explicitly rounded (nothing nvcc
  may contract), so the default build's PTX is the --fmad=false build's and their SASS does the
  same floating-point operations (with cuobjdump); the specialized quantize kernels' hot loops
  stay within 40 instructions per value (scripts/sass_report.py, with cuobjdump);
- the kernels run on a CPU emulation of the CUDA execution model (tests/ops/cuda_emu) and
  match the CPU codec byte for byte over presets, dtypes, sizes and random configs
  (skipped without g++);
- on a GPU with a CUDA build of the extension (marked `cuda`): torch ops on CUDA against the
  pure-PyTorch reference on CPU, bit for bit.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import bits_equal, CONFIG_VARIANTS, cuda_verdict, variant_id
from fp4quant import QuantConfig, ops, toolchain
from fp4quant.format.config import PRESETS
from fp4quant.reference import codec as reference

ROOT = Path(__file__).resolve().parents[2]
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
NVCC = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))
NVCC_FLAGS = ["-std=c++17", "--fmad=false", "-O3", f"-I{ROOT / 'csrc'}"]
# ptxas -v, per kernel: "Compiling entry function 'NAME'", ..., "N bytes stack frame, N bytes spill stores"
PTXAS_KERNEL = re.compile(
    r"Compiling entry function '(\w+)'[^\n]*\n(?:[^\n]*\n)*?\s*(\d+) bytes stack frame, (\d+) bytes spill stores"
)

COMPRESSED = sorted(p for p in PRESETS if p != "bf16")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [1, 15, 17, 1000, 70001]


# ---- compilation (no GPU needed) ----------------------------------------------------------


def nvcc(source: Path, out: Path, arch: str, *flags: str, merged: bool = False) -> subprocess.CompletedProcess:
    """nvcc on one file; ``merged``: stderr into stdout, in the order nvcc and ptxas wrote them."""
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA sources cannot be compiled here")
    archs = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
    if archs and f"compute_{arch}" not in archs:
        pytest.skip(f"this nvcc cannot target sm_{arch}")
    cmd = [NVCC, *NVCC_FLAGS, f"-arch=sm_{arch}", *flags, "-c", str(source), "-o", str(out)]
    if merged:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, capture_output=True, text=True)


def test_there_are_cuda_sources():
    assert [p.name for p in CUDA_SOURCES], "csrc/cuda has no .cu files"


@pytest.mark.slow
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda p: p.name)
def test_every_cu_file_compiles_for_sm90(source, tmp_path):
    # one compile: ptxas prints "Compiling entry function" to stderr and the stack/spill line to
    # stdout, so the two streams are read merged
    proc = nvcc(source, tmp_path / "out.o", "90", "-Xcompiler", "-Wall", "-Xptxas", "-v", merged=True)
    report = proc.stdout
    assert proc.returncode == 0, f"nvcc failed on {source.name}:\n{report}"
    own_warnings = [line for line in report.splitlines() if "warning" in line and "csrc" in line]
    assert not own_warnings, "\n".join(own_warnings)
    kernels = PTXAS_KERNEL.findall(report)
    assert kernels, f"no ptxas report for {source.name}:\n{report}"
    hot = ("fast_kernel", "spec_quantize_kernel")
    spilling = [name for name, stack, spills in kernels if any(h in name for h in hot) and (int(stack) or int(spills))]
    assert not spilling, f"fast kernels use local memory (register arrays indexed at run time?): {spilling}"


@pytest.mark.slow
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda p: p.name)
def test_every_cu_file_compiles_for_sm80(source, tmp_path):
    proc = nvcc(source, tmp_path / "out.o", "80")
    assert proc.returncode == 0, f"nvcc failed on {source.name} for sm_80:\n{proc.stderr}"


# ---- bit-exact whatever the flags (no GPU needed) ------------------------------------------

# PTX float arithmetic that ptxas may fuse into an FFMA: add/sub/mul/mad/fma without an explicit
# rounding modifier (add.rn.f32 and the like are never contracted; PTX ISA, "Floating point
# instructions")
CONTRACTIBLE = re.compile(
    r"^\s*(?:@!?%p\d+\s+)?((?:add|sub|mul|mad|fma)(?:\.ftz)?(?:\.sat)?\.f(?:16|16x2|32|64))\s", re.M)


def ptx(source: Path, out: Path, *flags: str) -> str:
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA sources cannot be compiled here")
    cmd = [NVCC, "-std=c++17", "-O3", f"-I{ROOT / 'csrc'}", "-arch=sm_90", *flags, "-ptx", str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=lambda p: p.name)
def test_cuda_float_arithmetic_is_the_same_with_and_without_fmad(source, tmp_path):
    """nvcc's default build (--fmad=true) may fuse a multiply and an add into one FFMA, which rounds
    once where the reference rounds twice.  The kernels write every float operation as an
    explicitly rounded intrinsic (fp4quant.h: mul_rn, add_rn, ...; fma_rn only where one rounding
    is the contract), so the default build's PTX holds nothing ptxas may contract and is the
    --fmad=false build's, instruction for instruction."""
    default = ptx(source, tmp_path / "default.ptx")
    contractible = sorted(set(CONTRACTIBLE.findall(default)))
    assert not contractible, f"{source.name}: float arithmetic without a rounding modifier: {contractible}"
    assert default == ptx(source, tmp_path / "nofmad.ptx", "--fmad=false"), f"{source.name}: --fmad changes the PTX"


def load_sass_report():
    spec = importlib.util.spec_from_file_location("fp4quant_sass_report", ROOT / "scripts" / "sass_report.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up)
    spec.loader.exec_module(module)
    return module


def cuobjdump_or_skip(report) -> str:
    if NVCC is None:
        pytest.skip("nvcc not found")
    try:
        return report.find_cuobjdump(NVCC)
    except SystemExit:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or a CUDA toolkit's)")


def float_opcodes(kernel) -> collections.Counter:
    """How many of each floating-point arithmetic SASS instruction (FFMA, FADD, FMUL, FMNMX, MUFU, ...)."""
    ops = collections.Counter()
    for _, text in kernel.instructions:
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        if op in ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FCHK", "MUFU", "HFMA2", "HADD2", "HMUL2", "F2F"):
            ops[op] += 1
    return ops


@pytest.mark.slow
def test_cuda_sass_of_the_default_build_does_the_fmad_false_builds_arithmetic(tmp_path, monkeypatch):
    """From the SASS (cuobjdump -sass of nvcc -cubin -arch=sm_90): every kernel of the default
    build issues the same floating-point instructions, FFMA included, as the --fmad=false build
    (ptxas may schedule them differently: the comparison is per kernel and opcode)."""
    report = load_sass_report()
    cuobjdump = cuobjdump_or_skip(report)
    default_flags = [f for f in report.NVCC_FLAGS if f != "--fmad=false"]
    monkeypatch.setattr(report, "NVCC_FLAGS", default_flags)
    default = report.build(NVCC, cuobjdump, ROOT / "csrc", tmp_path / "default")
    monkeypatch.setattr(report, "NVCC_FLAGS", default_flags + ["--fmad=false"])
    nofmad = report.build(NVCC, cuobjdump, ROOT / "csrc", tmp_path / "nofmad")
    assert sorted(default) == sorted(nofmad)
    differ = {name: (float_opcodes(default[name]), float_opcodes(nofmad[name])) for name in default
              if float_opcodes(default[name]) != float_opcodes(nofmad[name])}
    assert not differ, f"--fmad changes the float instructions of: {differ}"
    assert any(float_opcodes(k)["FFMA"] for k in default.values())  # the comparison sees FFMAs (fma_rn, divisions)


@pytest.mark.slow
def test_cuda_specialized_quantize_hot_loops_within_40_instructions_per_value(tmp_path):
    """scripts/sass_report.py's measure (static instructions of the persistent loop / values a
    thread takes per iteration) of the kernel each preset and dtype runs."""
    report = load_sass_report()
    cuobjdump = cuobjdump_or_skip(report)
    kernels = report.build(NVCC, cuobjdump, ROOT / "csrc", tmp_path, sources=["quantize.cu"])
    rows = report.spec_rows(kernels)
    assert {(preset, dtype) for preset, dtype, _, _ in rows} == {
        (preset, dtype) for preset in report.SPEC_PRESETS for dtype in report.DTYPES.values()}
    per_value = {(preset, dtype): report.hot_loop(k).count / values for preset, dtype, k, values in rows}
    over = {key: round(v, 2) for key, v in per_value.items() if v > 40}
    assert not over, f"hot loops over 40 instructions per value: {over}"
    assert all(not report.hot_loop(k).inner for preset, _, k, _ in rows if preset != "no_fwht")  # unrolled throughout


def test_cuda_emulator_and_extension_build_without_fp_contraction():
    """The host compilers must not contract either: the emulator compiles the kernels as C++, the
    extension the CPU kernels, both from the same fp4quant.h (its host side: plain operators)."""
    assert '"-ffp-contract=off"' in (Path(__file__).parent / "cuda_emu" / "build.py").read_text()
    assert '"-ffp-contract=off"' in (ROOT / "setup.py").read_text()


# ---- the kernels on the CPU emulator (no GPU needed) ---------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the emulator uses ucontext fibers (Linux)")
def test_cuda_kernels_on_cpu_emulator_match_the_cpu_codec(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: cannot build the CUDA emulator")
    build_py = Path(__file__).parent / "cuda_emu" / "build.py"
    spec = importlib.util.spec_from_file_location("fp4quant_cuda_emu_build", build_py)
    emu_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emu_build)
    exe = emu_build.build(tmp_path)
    mode = os.environ.get("FP4QUANT_EMU_MODE", "smoke")  # smoke | quick | full
    proc = subprocess.run([str(exe), mode, "1"], capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " 0 mismatches" in proc.stdout, proc.stdout[-6000:]


# ---- on a GPU --------------------------------------------------------------------------------


def inputs(rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values across 12 decades with outliers, non-finite values, zero runs, ties, subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * torch.logspace(-6, 6, rows)[:, None]
    if n >= 64:
        x[0, 3] = float("nan")
        x[-1, n // 2] = float("inf")
        x[-1, n // 2 + 1] = float("-inf")
        x[:, 16:32] = 0.0
        x[0, 40:48] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])  # E2M1 ties at scale 1
        x[0, 50] = 3.0e38
        x[0, 51] = 1e-40
    return x.to(dtype)


def check_quantize(x: torch.Tensor, config: QuantConfig, seed: int = 3, offset: int = 0) -> torch.Tensor:
    """CUDA quantize_rows == reference byte for byte, for both packings; returns the messages (CPU)."""
    oracle = reference.quantize_rows(x, config, seed, offset)
    for packing in ("warp", "naive"):
        got = ops.quantize_rows(x.cuda(), config.replace(packing=packing), seed, offset).cpu()
        differ = int((got != oracle).sum())
        assert differ == 0, f"quantize ({packing}): {differ} of {oracle.numel()} bytes differ"
    return oracle


def check_decoding(msgs: torch.Tensor, n: int, config: QuantConfig, dtype: torch.dtype, seed: int = 4, offset: int = 0):
    got = ops.dequantize_rows(msgs.cuda(), n, config, dtype).cpu()
    assert bits_equal(got, reference.dequantize_rows(msgs, n, config, dtype)), "dequantize_rows"
    out = torch.full((msgs.shape[0], n), float("nan"), dtype=dtype, device="cuda")
    assert bits_equal(ops.dequantize_rows(msgs.cuda(), n, config, dtype, out=out).cpu(), got), "dequantize_rows into out"
    for requantize in (True, False):
        got = ops.dequantize_reduce(msgs.cuda(), n, config, dtype, requantize, seed, offset).cpu()
        want = reference.dequantize_reduce(msgs, n, config, dtype, requantize, seed, offset)
        assert bits_equal(got, want), f"dequantize_reduce(requantize={requantize})"


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_native")
@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_bit_exact_every_preset_dtype_size(name, dtype):
    config = QuantConfig.preset(name)
    for n in SIZES:
        for rows in (1, 2, 3):
            x = inputs(rows, n, dtype, seed=n + rows)
            try:
                msgs = check_quantize(x, config)
                check_decoding(msgs, n, config, dtype)
            except AssertionError as exc:
                raise AssertionError(f"{name} {dtype} n={n} rows={rows}: {exc}") from None


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_native")
@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("offset", [0, 2**32 - 1500, 2**64 - 100], ids=["0", "crossing-2^32", "wrapping-2^64"])
def test_cuda_bit_exact_stochastic_rounding(name, offset):
    config = QuantConfig.preset(name, rounding="stochastic")
    rows = 1 if offset > 2**63 else 2  # row 1's counters would start past 2**64 (the reference refuses)
    x = inputs(rows, 3000, torch.bfloat16, seed=7)
    msgs = check_quantize(x, config, seed=2**63 + 12345, offset=offset)
    check_decoding(msgs, 3000, config, torch.bfloat16, seed=99, offset=offset)


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_native")
@pytest.mark.parametrize("overrides", CONFIG_VARIANTS, ids=variant_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)  # float16: the preset test
def test_cuda_bit_exact_config_variants(overrides, dtype):
    config = QuantConfig.preset("fp4quant", **overrides)
    for n, rows in ((17, 2), (5001, 3), (70001, 1)):
        x = inputs(rows, n, dtype, seed=n)
        try:
            msgs = check_quantize(x, config, seed=5, offset=99)
            check_decoding(msgs, n, config, dtype)
        except AssertionError as exc:
            raise AssertionError(f"{overrides} {dtype} n={n} rows={rows}: {exc}") from None


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_native")
@pytest.mark.parametrize("name", ["fp4quant", "single_scale", "nvfp4", "mxfp4"])
def test_cuda_unaligned_and_strided_rows(name):
    """Rows that start off 16-byte boundaries take the scalar loads; the bytes do not change."""
    config = QuantConfig.preset(name)
    for dtype in (torch.float32, torch.bfloat16):
        base = inputs(3, 5003, dtype, seed=11)
        gpu = base.cuda()
        for cols in (slice(1, None), slice(3, 5002), slice(0, 4097)):  # offset data pointers, odd row strides
            want = reference.quantize_rows(base[:, cols].contiguous(), config, 1, 0)
            got = ops.quantize_rows(gpu[:, cols], config, 1, 0).cpu()
            assert torch.equal(got, want), f"{dtype} columns {cols}"
    # messages that start at odd addresses: nvfp4 at n=16 has 13 bytes per row
    msgs = check_quantize(inputs(3, 16, torch.float32, seed=12), config)
    check_decoding(msgs, 16, config, torch.float32)


@pytest.mark.cuda
@pytest.mark.usefixtures("cuda_native")
def test_cuda_empty_inputs():
    config = QuantConfig.preset("fp4quant")
    assert ops.quantize_rows(torch.empty(2, 0, device="cuda"), config).shape == (2, 0)
    assert ops.quantize_rows(torch.empty(0, 100, device="cuda"), config).shape[0] == 0
    msgs = torch.empty(2, 0, dtype=torch.uint8, device="cuda")
    assert ops.dequantize_rows(msgs, 0, config, torch.float32).shape == (2, 0)
    assert ops.dequantize_reduce(msgs, 0, config, torch.float32, True).numel() == 0
    assert ops.dequantize_reduce(msgs, 0, config, torch.float32, False).numel() == 0


# ---- a GPU machine tests its GPU -------------------------------------------------------------

H100 = toolchain.Gpus(("NVIDIA H100 80GB HBM3",), "550.54.15", (12, 4), ("9.0",))


def test_cuda_tests_skip_only_where_there_is_no_gpu():
    assert cuda_verdict(None, False)[0] == "skip"
    assert cuda_verdict(H100, True) is None and cuda_verdict(None, True) is None
    verdict, why = cuda_verdict(H100, False)
    assert verdict == "fail" and why.startswith("nvidia-smi lists 1 GPU(s) (NVIDIA H100 80GB HBM3), driver 550.54.15")
    verdict, why = cuda_verdict(H100, True, "fp4quant._C was built without CUDA kernels")
    assert verdict == "fail" and why.endswith("CUDA kernels are not in use: fp4quant._C was built without CUDA kernels")
    assert cuda_verdict(None, True, "no kernels")[0] == "fail"  # torch sees a GPU that nvidia-smi does not list


def test_cuda_tests_name_a_driver_too_old_for_torchs_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    verdict, why = cuda_verdict(H100, False)
    assert verdict == "fail" and "torch.cuda.is_available() is False; the driver runs CUDA <= 12.4 only" in why


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs torch without a GPU")
def test_cuda_tests_fail_where_nvidia_smi_lists_a_gpu_torch_cannot_use(fake_gpu):
    """The suite on a GPU machine whose torch cannot use the GPU is red and says why (this torch
    being what such a machine would have: here, a CPU build)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-k", "empty_inputs",
           str(Path(__file__))]
    if toolchain.nvidia_gpus() is None:  # this machine, as it is: no GPU, a green skip
        skipped = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    fake_gpu(driver="580.65.06", cuda="13.0")
    failed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and "1 error" in failed.stdout, failed.stdout[-3000:]
    assert ("Failed: nvidia-smi lists 1 GPU(s) (NVIDIA H100 80GB HBM3), driver 580.65.06 (CUDA <= 13.0) but torch "
            f"{torch.__version__}") in failed.stdout, failed.stdout[-3000:]
