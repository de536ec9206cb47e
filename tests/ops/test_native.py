"""The native CPU kernels against the pure-PyTorch reference, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from helpers import bits_equal, CONFIG_VARIANTS, variant_id
from fp4quant import QuantConfig, dequantize, ops, quantize
from fp4quant.format.config import PRESETS
from fp4quant.format.packed import layout
from fp4quant.ops.codes import from_codes, to_codes
from fp4quant.reference import codec as reference

pytestmark = pytest.mark.usefixtures("native_cpu")

COMPRESSED = sorted(p for p in PRESETS if p != "bf16")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def inputs(rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values across 12 decades with outliers, non-finite values, zero runs, ties and signed
    zeros (bits_equal tells -0.0 from +0.0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * torch.logspace(-4, 4, rows)[:, None]
    if n >= 64:
        x[0, 3] = float("nan")
        x[-1, n // 2] = float("inf")
        x[:, 16:32] = 0.0
        x[:, 33:36] = -0.0
        x[:, 36:40] = -x[:, 36:40].abs() * 1e-7  # negatives that round to zero
        x[1:, 48:64] = -0.0  # a micro-group of negative zeros
        x[0, 40:48] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])  # E2M1 ties at scale 1
        x[0, 40 + 8] = 6.0
    return x.to(dtype)


def check_all_ops(x: torch.Tensor, config: QuantConfig, seed: int = 3, offset: int = 0) -> None:
    n, dtype = x.shape[1], x.dtype
    native = ops.quantize_rows(x, config, seed, offset)
    oracle = reference.quantize_rows(x, config, seed, offset)
    assert torch.equal(native, oracle), f"quantize: {int((native != oracle).sum())} bytes differ"
    for saturate in (True, False):
        a = ops.dequantize_rows(native, n, config, dtype, saturate)
        assert bits_equal(a, reference.dequantize_rows(oracle, n, config, dtype, saturate)), f"dequantize({saturate})"
        out = torch.full_like(a, float("nan"))  # every value must be written over
        assert ops.dequantize_rows(native, n, config, dtype, saturate, out=out) is out
        assert bits_equal(out, a), f"dequantize({saturate}) into out"
    for requantize in (True, False):
        a = ops.dequantize_reduce(native, n, config, dtype, requantize, seed + 1, offset)
        b = reference.dequantize_reduce(oracle, n, config, dtype, requantize, seed + 1, offset)
        assert bits_equal(a, b), f"dequantize_reduce(requantize={requantize})"


@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 15, 17, 1000, 2048, 5001])
def test_bit_exact_every_preset_dtype_size(name, dtype, n):
    check_all_ops(inputs(3, n, dtype, seed=n), QuantConfig.preset(name))


@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4"])
def test_dequantize_streamed_past_the_caches_is_bit_exact(name):
    """A float32 output of 32 MiB or more is written with streaming stores (its own store path): same bits."""
    n = (8 << 20) + 4099  # just over 32 MiB, and a ragged last span
    x = inputs(1, n, torch.float32, seed=5)
    config = QuantConfig.preset(name)
    msg = ops.quantize_rows(x, config)
    for saturate in (True, False):
        got = ops.dequantize_rows(msg, n, config, torch.float32, saturate)
        assert bits_equal(got, reference.dequantize_rows(msg, n, config, torch.float32, saturate)), saturate


@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4", "mxfp4", "int4", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_exact_stochastic_rounding(name, dtype):
    config = QuantConfig.preset(name, rounding="stochastic")
    # an offset just below 2**32 makes the counters carry into their high word
    check_all_ops(inputs(2, 3000, dtype, seed=7), config, seed=2**63 + 12345, offset=2**32 - 1500)


@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4"])
def test_bit_exact_stochastic_rounding_as_the_counters_wrap_past_2_64(name):
    # the high word wraps from 2**32 - 1 to 0 inside micro-group 6 (one row: a second row's
    # counters would start past 2**64, which the reference refuses)
    config = QuantConfig.preset(name, rounding="stochastic")
    check_all_ops(inputs(1, 3000, torch.bfloat16, seed=7), config, seed=2**63 + 12345, offset=2**64 - 100)


@pytest.mark.parametrize("overrides", CONFIG_VARIANTS, ids=variant_id)
def test_bit_exact_other_configs(overrides):
    config = QuantConfig(**overrides)
    check_all_ops(inputs(2, 4 * config.block + 5, torch.float32, seed=11), config)
    check_all_ops(inputs(2, 3 * config.block, torch.bfloat16, seed=12), config.replace(rounding="stochastic"))


def extremes(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows across float32's whole range (float16: up to its overflow), each with a NaN and an Inf
    in one row, so that sums mix magnitudes 2**250 apart and overflow the dtype."""
    g = torch.Generator().manual_seed(seed)
    tops = [1e-40, 1e-30, 1e-3, 1e10, 1e37, 3e38] if dtype != torch.float16 else [1e-7, 1e-3, 6e4, 65504.0]
    x = torch.randn(len(tops), n, generator=g)
    x = x / x.abs().amax(dim=1, keepdim=True) * torch.tensor(tops)[:, None]
    x[-1, : n // 2] = x[-1, : n // 2].sign() * tops[-1]  # half the top row at the top
    x[1, n // 3] = float("nan")
    x[2, n // 5] = float("inf")
    return x.to(dtype)


@pytest.mark.parametrize("name", COMPRESSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_exact_across_the_range_and_on_overflow(name, dtype):
    config = QuantConfig.preset(name)
    check_all_ops(extremes(2 * config.block + 37, dtype, seed=1), config)
    check_all_ops(extremes(3000, dtype, seed=2), config.replace(rounding="stochastic"))


@pytest.mark.parametrize("overrides", CONFIG_VARIANTS, ids=variant_id)
def test_bit_exact_across_the_range_other_configs(overrides):
    config = QuantConfig(**overrides)
    check_all_ops(extremes(2 * config.block + 5, torch.float32, seed=3), config)


def test_adversarial_scale_ties_and_extremes():
    # micro-group maxima that put the wanted E4M3 scale exactly on its rounding ties
    g = torch.Generator().manual_seed(5)
    e4m3 = torch.arange(8, 0x7E, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (e4m3[:-1] + e4m3[1:]) / 2  # ties between neighbouring E4M3 values
    x = torch.randn(len(mids), 16, generator=g).abs().clamp(max=1.0)
    x[:, 0] = mids * 6.0  # t = amax / 6 = a tie, with no coarse scale
    x = torch.cat([x.reshape(-1), torch.tensor([1e38, -1e38, 1e-40, 3e-39] * 4)])
    for config in (QuantConfig.preset("fp4quant", coarse_scale="none", fwht="none"), QuantConfig.preset("single_scale"),
                   QuantConfig.preset("fp4quant"), QuantConfig.preset("nvfp4")):
        check_all_ops(x[None], config)


def test_public_api_uses_native_and_matches_reference():
    x = torch.randn(37, 129)
    config = QuantConfig()
    p = quantize(x, config)
    r = reference.quantize(x, config)
    assert torch.equal(p.to_bytes(), r.to_bytes())
    assert torch.equal(dequantize(p), reference.dequantize(r))


def test_non_contiguous_rows():
    x = torch.randn(64, 3000)[::2, 7:2500]
    config = QuantConfig()
    assert torch.equal(ops.quantize_rows(x, config), reference.quantize_rows(x.contiguous(), config))


def test_empty_and_single_row():
    config = QuantConfig()
    assert ops.quantize_rows(torch.empty(2, 0), config).shape == (2, 0)
    assert ops.dequantize_rows(torch.empty(3, 0, dtype=torch.uint8), 0, config, torch.float32).shape == (3, 0)
    assert ops.dequantize_reduce(torch.empty(2, 0, dtype=torch.uint8), 0, config, torch.float16, False).shape == (0,)


def test_bad_inputs_raise_clear_errors():
    config = QuantConfig()
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        ops.quantize_rows(torch.zeros(2, 4, dtype=torch.int32), config)
    with pytest.raises(ValueError, match="2-D"):
        ops.quantize_rows(torch.zeros(4), config)
    with pytest.raises(ValueError, match=r"shape \(rows, 1156\)"):
        ops.dequantize_rows(torch.zeros(2, 100, dtype=torch.uint8), 2000, config, torch.float32)
    with pytest.raises(ValueError, match="at least one message"):
        ops.dequantize_reduce(torch.zeros(0, 1156, dtype=torch.uint8), 2000, config, torch.float32, True)
    with pytest.raises(ValueError, match="bf16 preset"):
        ops.quantize_rows(torch.zeros(2, 4), QuantConfig.preset("bf16"))
    with pytest.raises(RuntimeError, match="config must have 9 integers"):
        torch.ops.fp4quant.quantize(torch.zeros(1, 4), [0, 16], None, 0, 0)
    with pytest.raises(RuntimeError, match="group must be a power of two"):
        torch.ops.fp4quant.quantize(torch.zeros(1, 4), [0, 16, 100, 0, 0, 0, 1, 0, 0], None, 0, 0)


def test_dequantize_into_checks_out_and_the_reference_writes_it_too(monkeypatch):
    config = QuantConfig.preset("nvfp4")
    msgs = ops.quantize_rows(torch.randn(2, 100), config)
    for bad, what in ((torch.empty(2, 100, dtype=torch.float16), "float16"), (torch.empty(3, 100), r"\(3, 100\)"),
                      (torch.empty(100, 2).t(), "non-contiguous")):
        with pytest.raises(ValueError, match=rf"out must be a contiguous \(2, 100\) torch.float32 .*got .*{what}"):
            ops.dequantize_rows(msgs, 100, config, torch.float32, out=bad)
    codes, signs = to_codes(config), None
    with pytest.raises(RuntimeError, match="out must be float32, bfloat16 or float16, got Int"):
        torch.ops.fp4quant.dequantize_into(msgs, 100, codes, signs, True, torch.empty(2, 100, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"out must have shape \(2, 100\)"):
        torch.ops.fp4quant.dequantize_into(msgs, 100, codes, signs, True, torch.empty(2, 99))
    with pytest.raises(RuntimeError, match="out overlaps msgs"):  # the values would overwrite the codes they come from
        shared = torch.empty(2, 100)
        codes_there = shared.view(-1).view(torch.uint8)[: msgs.numel()].view(msgs.shape).copy_(msgs)
        torch.ops.fp4quant.dequantize_into(codes_there, 100, codes, signs, True, shared)
    want = ops.dequantize_rows(msgs, 100, config, torch.bfloat16)
    monkeypatch.setattr(ops, "backend", lambda device: "reference")
    out = torch.full((2, 100), float("nan"), dtype=torch.bfloat16)
    assert ops.dequantize_rows(msgs, 100, config, torch.bfloat16, out=out) is out and bits_equal(out, want)


def test_config_codes_round_trip():
    for name in COMPRESSED:
        config = QuantConfig.preset(name)
        assert from_codes(to_codes(config)) == config.replace(fwht_seed=None)


def test_opcheck_every_op():
    config = to_codes(QuantConfig())
    signs = ops._signs(QuantConfig(), torch.device("cpu"))
    x = torch.randn(2, 3000)
    msgs = torch.ops.fp4quant.quantize(x, config, signs, 1, 2)
    n = 3000
    torch.library.opcheck(torch.ops.fp4quant.quantize, (x, config, signs, 1, 2))
    torch.library.opcheck(torch.ops.fp4quant.dequantize, (msgs, n, config, signs, torch.bfloat16))
    torch.library.opcheck(torch.ops.fp4quant.dequantize_into, (msgs, n, config, signs, False, torch.empty(2, n)))
    torch.library.opcheck(torch.ops.fp4quant.dequantize_reduce, (msgs, n, config, signs, torch.float32, True, 3, 4))
    torch.library.opcheck(torch.ops.fp4quant.dequantize_reduce, (msgs, n, config, signs, torch.float16, False, 0, 0))


def test_fake_kernels_give_the_real_shapes():
    config = QuantConfig.preset("nvfp4")
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(3, 1000)
        out = torch.ops.fp4quant.quantize(x, to_codes(config), None, 0, 0)
        assert out.shape == (3, layout(1000, config).nbytes) and out.dtype == torch.uint8


def test_under_torch_compile():
    config = QuantConfig.preset("no_fwht")
    codes = to_codes(config)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def round_trip(x):
        msgs = torch.ops.fp4quant.quantize(x, codes, None, 0, 0)
        return torch.ops.fp4quant.dequantize(msgs, x.shape[1], codes, None, x.dtype)

    x = torch.randn(2, 4096)
    assert torch.equal(round_trip(x), reference.dequantize_rows(reference.quantize_rows(x, config), 4096, config, x.dtype))


def test_thread_safety():
    """Several Python threads calling the ops at once get exactly their own results."""
    config = QuantConfig()
    xs = [torch.randn(2, 20000, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    want = [reference.quantize_rows(x, config) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                if not torch.equal(ops.quantize_rows(xs[i], config), want[i]):
                    errors.append(i)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


CHECK_SCRIPT = """
import torch
from fp4quant import QuantConfig, ops
from fp4quant.format.config import PRESETS
from fp4quant.reference import codec as ref
assert ops._native.module.cpu_isa() == "{isa}", ops._native.module.cpu_isa()
g = torch.Generator().manual_seed(0)
same = lambda p, q: torch.equal(p.isnan(), q.isnan()) and torch.equal(p.masked_fill(p.isnan(), 0), q.masked_fill(q.isnan(), 0))
for name in PRESETS:
    if name == "bf16":
        continue
    for rounding in ("nearest", "stochastic"):
        c = QuantConfig.preset(name, rounding=rounding)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = (torch.randn(2, 4100, generator=g) * 1e3).to(dtype)
            x[0, 5] = float("nan")
            a, b = ops.quantize_rows(x, c, 9, 1), ref.quantize_rows(x, c, 9, 1)
            assert torch.equal(a, b), (name, rounding, dtype)
            d1, d2 = ops.dequantize_rows(a, 4100, c, dtype), ref.dequantize_rows(b, 4100, c, dtype)
            assert torch.equal(torch.isnan(d1), torch.isnan(d2)) and torch.equal(d1.nan_to_num(), d2.nan_to_num())
            r1, r2 = ops.dequantize_reduce(a, 4100, c, dtype, True, 1, 2), ref.dequantize_reduce(b, 4100, c, dtype, True, 1, 2)
            assert torch.equal(r1, r2), (name, rounding, dtype)
    # the range's edges: huge, tiny and float16-overflowing rows, one message and sums
    for dtype, tops in ((torch.float32, (3e38, 1e37, 1e-40)), (torch.float16, (65504.0, 6e4, 1e-7))):
        x = (torch.randn(3, 4100, generator=g) * torch.tensor(tops)[:, None] / 4).clamp(-tops[0], tops[0]).to(dtype)
        a = ops.quantize_rows(x, name)
        assert torch.equal(a, ref.quantize_rows(x, name)), (name, dtype)
        for sat in (True, False):
            d1, d2 = ops.dequantize_rows(a, 4100, name, dtype, sat), ref.dequantize_rows(a, 4100, name, dtype, sat)
            assert same(d1, d2), (name, dtype, sat)
        r1, r2 = ops.dequantize_reduce(a, 4100, name, dtype, False), ref.dequantize_reduce(a, 4100, name, dtype, False)
        assert same(r1, r2), (name, dtype)
        assert torch.equal(ops.dequantize_reduce(a, 4100, name, dtype, True), ref.dequantize_reduce(a, 4100, name, dtype, True))
print("ok")
"""


def cpu_isas() -> list[str]:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isas = ["scalar"]
    if " avx2 " in flags and " fma " in flags:
        isas.append("avx2")
    if " avx512f " in flags and " avx512bw " in flags and " avx512dq " in flags and " avx512vl " in flags:
        isas.append("avx512")
    return isas


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_every_instruction_set_is_bit_exact(isa):
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    env = {**os.environ, "FP4QUANT_CPU_ISA": isa, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CHECK_SCRIPT.format(isa=isa)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_instruction_set_is_the_one_asked_for():
    """FP4QUANT_CPU_ISA, where set (as the test below sets it), chooses the kernels; unset, the widest the CPU has."""
    want = os.environ.get("FP4QUANT_CPU_ISA") or cpu_isas()[-1]
    assert ops._native.module.cpu_isa() == want


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_this_files_bit_exact_tests_under_every_instruction_set(isa):
    """The run itself uses the widest instruction set only: this file's bit-exactness tests again
    with each narrower one the CPU has (on an AVX-512 machine the AVX2 kernels are otherwise
    checked only by the script above)."""
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    if isa == cpu_isas()[-1]:
        pytest.skip(f"{isa} is the default here: the run itself tested it")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "FP4QUANT_CPU_ISA": isa}
    selected = "(bit_exact and not instruction_set) or instruction_set_is_the_one"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", os.path.abspath(__file__),
                          "-k", selected], env=env, cwd=root, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout, out.stdout[-2000:]


def test_reference_fallback_warns_once_and_matches():
    script = (
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    import fp4quant\n"
        "    from fp4quant import ops, QuantConfig\n"
        "    x = torch.randn(2, 3000)\n"
        "    m = ops.quantize_rows(x, QuantConfig())\n"
        "    ops.quantize_rows(x, QuantConfig())\n"
        "print(ops.backend('cpu'), sum('native kernels unavailable' in str(i.message) for i in w))\n"
        "torch.save(m, '{out}')\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "m.pt")
        env = {**os.environ, "FP4QUANT_BACKEND": "reference"}
        res = subprocess.run([sys.executable, "-c", script.format(out=out_path)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["reference", "0"]  # asked for by name: no warning
        m = torch.load(out_path)
    x = torch.randn(2, 3000, generator=None)
    assert m.shape == ops.quantize_rows(x, QuantConfig()).shape


def test_build_provenance_mismatch_is_explained(monkeypatch, tmp_path):
    from fp4quant.ops import _native

    info = tmp_path / "_build_info.json"
    info.write_text('{"torch": "0.0.1"}')
    monkeypatch.setattr(_native, "BUILD_INFO", info)
    module, _, reason = _native._load()
    assert module is None and "built for torch 0.0.1" in reason and "rebuild" in reason
    monkeypatch.setattr(_native, "BUILD_INFO", tmp_path / "missing.json")
    assert "without its extension" in _native._load()[2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")


def test_e2m1_rounding_on_a_fine_grid_and_one_ulp_around_every_tie():
    """The table-driven E2M1 rounding of the fast path: 4097 magnitudes across [0, 6], the tie
    points, and the floats just above and below each, both signs, at micro-scale 1."""
    config = QuantConfig.preset("no_fwht", micro_group=16, group=16, coarse_scale="none")
    vals = torch.tensor([6.0 * i / 4096 for i in range(4097)] + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    near = torch.cat([vals, torch.nextafter(vals, torch.full_like(vals, 10.0)), torch.nextafter(vals, torch.zeros_like(vals))])
    x = near[: near.numel() // 16 * 16].reshape(-1, 16).clone()
    x[:, 0] = 6.0  # each micro-group's amax is 6: its scale is 1
    x = torch.cat([x, -x]).reshape(1, -1)
    assert torch.equal(ops.quantize_rows(x, config), reference.quantize_rows(x, config))


@pytest.mark.parametrize("name", ["fp4quant", "no_fwht", "nvfp4", "single_scale"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bit_exact_with_a_non_finite_micro_group_at_every_position(name, dtype):
    """The fast paths encode four micro-groups at a time and fall back to one at a time around a
    non-finite one: a NaN or an Inf in each of the 16 micro-groups of a 256-value block, one row
    each, with finite values around it (and spans that hold none)."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(32, 4096 + 37, generator=g)
    for row in range(32):
        x[row, 256 * (row % 4) + 16 * (row % 16) + row % 7] = float("nan") if row % 2 else -float("inf")
    check_all_ops(x.to(dtype), QuantConfig.preset(name))
