"""fp4quant.parallel.styles: compressed DTensor parallel styles, on gloo with TP = 2.

Exact (comm="exact"): the logits and every parameter gradient equal one process's whole
model and the stock torch styles on the same plan.  Compressed (the fp4quant default):

Error bound of one column -> row layer pair.  eps (eps_sr): the NMSE of one quantization of
a Gaussian tensor under the forward (backward, stochastic-rounding) config, measured here.
The row layer's output is the two-shot all-reduce of W partial outputs: each partial is
quantized once (error eps ||y_r||^2) and the reduced shard once more (eps ||y||^2), so
NMSE(y) ~ eps (sum_r ||y_r||^2 + ||sum_r y_r||^2) / ||y||^2 (tests/comm/test_collectives.py
derives the same for independent inputs).  The input gradient is the two-shot
all-reduce of the W partial input gradients under eps_sr alike; nothing else in the pair is
compressed (the forward activations of the column layer are exact, and the row layer's
output gradient crosses no wire).  We allow 1.25x the estimate.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from fp4quant import dequantize, quantize
from fp4quant.bench.error import nmse
from fp4quant.bench.tensors import make
from fp4quant.format.config import QuantConfig
from fp4quant.parallel import CommConfig
from fp4quant.parallel.styles import CompressedColwiseParallel, CompressedRowwiseParallel, comm_config

pytestmark = pytest.mark.timeout(300)

KINDS = ["stock", "compressed", "sp-stock", "sp-compressed", "mixed"]


def close(a, b, tol=1e-5):
    return torch.allclose(a, b, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def exact():
    return run_ranks("parallel.style_jobs:forward_backward", 2, dict(kinds=KINDS, comm_spec="exact"), timeout=240)


def test_exact_equals_single_process_and_stock_styles(exact):
    for out in exact:
        single = out["single"]
        assert all(g.abs().max() > 0 for g in single["grads"].values())
        for kind in KINDS:
            got = out[kind]
            assert close(got["logits"], single["logits"]), kind
            for name, g in single["grads"].items():
                assert close(got["grads"][name], g), (kind, name)
        for ours, stock in (("compressed", "stock"), ("sp-compressed", "sp-stock")):
            assert close(out[ours]["logits"], out[stock]["logits"])
            for name, g in out[stock]["grads"].items():
                assert close(out[ours]["grads"][name], g), (ours, name)
            assert out[ours]["weight_is_dtensor"] and out[ours]["communicators"] == 1
            for direction in ("fwd", "bwd"):  # exact: the tensor's own bytes
                s = out[ours]["stats"][direction]
                assert s["calls"] > 0 and s["bytes_sent"] == s["bytes_uncompressed"]
        assert out["stock"]["stats"] == {}  # stock modules send nothing through fp4quant


def test_mixed_plan_compresses_only_its_compressed_modules(exact):
    stats = exact[0]["mixed"]["stats"]
    # blocks.1.w2 all-reduces forward; blocks.0.w1 and the head reduce their input gradients
    assert stats["fwd"]["calls"] == 1 and stats["bwd"]["calls"] == 2


def eps(config: QuantConfig, numel: int = 1 << 18, seeds: int = 3) -> float:
    g = torch.Generator().manual_seed(0)
    return sum(nmse(dequantize(quantize(x, config, generator=g)), x)
               for x in (make("gaussian", numel, s) for s in range(seeds))) / seeds


def test_default_is_fp4quant_in_both_directions_and_within_the_derived_bound():
    config = comm_config(None)
    assert config == CommConfig.from_preset("fp4quant", "both")
    ranks = run_ranks("parallel.style_jobs:layer_error", 2, dict(comm_spec=None), timeout=240)
    whole, tp = ranks[0]["whole"], ranks[0]["tp"]
    assert torch.equal(ranks[0]["tp"]["y"], ranks[1]["tp"]["y"])  # every rank decodes the same bytes
    assert torch.equal(ranks[0]["tp"]["dx"], ranks[1]["tp"]["dx"])
    for key, cfg in (("y", config.fwd), ("dx", config.bwd)):
        partials, reduced = ranks[0]["energy"][key]
        estimate = eps(cfg) * (partials + reduced) / float(whole[key].double().pow(2).sum())
        err = nmse(tp[key], whole[key])
        assert 0.5 * estimate < err < 1.25 * estimate, (key, err, estimate)


def test_fp4quant_compresses_both_directions_and_trains_like_exact():
    ranks = run_ranks("parallel.style_jobs:forward_backward", 2,
                      dict(kinds=["compressed", "sp-compressed"], comm_spec="fp4quant"), timeout=240)
    for kind in ("compressed", "sp-compressed"):
        for direction in ("fwd", "bwd"):
            s = ranks[0][kind]["stats"][direction]
            assert 0 < s["bytes_sent"] < s["bytes_uncompressed"] / 4, (kind, direction, s)
        assert torch.equal(ranks[0][kind]["logits"], ranks[1][kind]["logits"])
    exact = run_ranks("parallel.style_jobs:train", 2, dict(comm_spec="exact"), timeout=240)[0]
    fp4 = run_ranks("parallel.style_jobs:train", 2, dict(comm_spec="fp4quant"), timeout=240)[0]
    assert exact["state_is_dtensor"] and len(fp4["losses"]) == 50
    final = [sum(r["losses"][-10:]) / 10 for r in (exact, fp4)]
    assert final[0] < 0.8 * exact["losses"][0]  # it learned
    assert abs(final[1] - final[0]) < 0.02 * final[0], final


@pytest.mark.parametrize("comm_spec", ["exact", "fp4quant"])
def test_torch_compile_runs_forward_and_backward(comm_spec):
    ranks = run_ranks("parallel.style_jobs:compiled", 2, dict(comm_spec=comm_spec), timeout=280)
    for out in ranks:
        got, ref = out["got"], out["ref"]
        if comm_spec == "exact":
            assert close(got["logits"], ref["logits"])
            for name, g in ref["grads"].items():
                assert close(got["grads"][name], g), name
        else:  # compiled kernels round differently in the last bits, which can flip an FP4 code
            assert nmse(got["logits"], ref["logits"]) < 0.1 * eps(QuantConfig.preset("fp4quant"))
            assert all(torch.isfinite(g).all() for g in got["grads"].values())


def test_bad_input_gets_one_clear_error():
    errors = run_ranks("parallel.style_jobs:bad_inputs", 2, timeout=120)[0]
    expected = {
        "mesh_2d": "ValueError: tensor parallelism needs a 1-D mesh",
        "not_divisible": "9 is not divisible by the TP size 2",
        "heads": "the TP size 2 does not divide the 3 attention heads",
        "module_type": "NotImplementedError: CompressedRowwiseParallel supports nn.Linear and nn.Embedding",
        "comm": "TypeError: comm must be a CommConfig or a preset name, got int",
        "preset": "fp5",
        "rowwise_input": "must be sharded on its last dimension",
    }
    for case, text in expected.items():
        assert errors[case] is not None and text in errors[case], (case, errors[case])
        assert "\n" not in errors[case], errors[case]


def test_styles_keep_the_stock_arguments():
    col = CompressedColwiseParallel(use_local_output=False, comm="exact")
    assert col.comm == CommConfig() and not col.use_local_output
    assert "comm=" in repr(CompressedRowwiseParallel())


def test_dp_x_tp_on_four_ranks_equals_one_process():
    for out in run_ranks("parallel.style_jobs:dp_tp", 4, dict(comm_spec="exact"), timeout=280):
        assert close(out["logits"], out["single_logits"])
        for name, g in out["single_grads"].items():
            assert close(out["grads"][name], g), name
