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
from fp4quant.parallel.styles import (
    CompressedColwiseParallel,
    CompressedPrepareModuleInput,
    CompressedRowwiseParallel,
    comm_config,
)

pytestmark = pytest.mark.timeout(300)

KINDS = ["stock", "compressed", "sp-stock", "sp-compressed", "mixed"]
GATED = ["per-projection", "block", "block-sp", "block-local", "block-stock", "block-stock-input"]


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


def calls(out) -> tuple[int, int]:
    return tuple(out["stats"].get(d, {}).get("calls", 0) for d in ("fwd", "bwd"))


def test_block_input_reduces_a_shared_input_gradient_once():
    """Gated MLP blocks (w1 and w3 on one input), exact wire: every plan gives the one-process
    logits and gradients; the block-level input sends one backward reduction per block where
    the per-projection plan sends one per column-parallel layer."""
    for out in run_ranks("parallel.style_jobs:gated_forward_backward", 2, dict(kinds=GATED), timeout=240):
        single = out["single"]
        for kind in GATED:
            assert close(out[kind]["logits"], single["logits"]), kind
            for name, g in single["grads"].items():
                assert close(out[kind]["grads"][name], g), (kind, name)
        # 2 blocks; forward: the embedding's and each w2's reduction; backward: the head's input
        # gradient, then per block w1's and w3's (per projection) or the block input's (block)
        assert calls(out["per-projection"]) == (3, 5)
        assert calls(out["block"]) == (3, 3)
        # sequence parallel: embedding reduce-scatter, per block an all-gather and a reduce-scatter,
        # the head's all-gather; backward the conjugate of each (one reduce-scatter per block input)
        assert calls(out["block-sp"]) == (6, 6)
        # use_local_output=True: the module gets a plain tensor, its projections reduce (stock meaning)
        assert calls(out["block-local"]) == (3, 5)
        # a stock PrepareModuleInput made the block input: DTensor reduces it, exactly and once
        assert calls(out["block-stock-input"]) == (3, 1)
        assert out["block-stock-input"]["collectives"]["all_reduce"] == 2
        # nothing else crosses the wire: the exact wire's all-reduces are the counted ones, and
        # DTensor's own collectives are only the head's gathered logits
        for kind in ("block", "per-projection"):
            collectives = out[kind]["collectives"]
            assert collectives.pop("allreduce_") == sum(calls(out[kind])), kind
            assert collectives.pop("all_gather_into_tensor") == 1, (kind, collectives)
            assert "all_reduce" not in collectives, (kind, collectives)


def test_row_outputs_kept_as_dtensors_reduce_their_consumers_partial_gradients():
    """A rowwise output with use_local_output=False is a Replicate DTensor: the colwise layer
    after it takes it as prepared, and the producer reduces the partial gradient (compressed)."""
    for out in run_ranks("parallel.style_jobs:dtensor_producers", 2, timeout=240):
        assert close(out["tp"]["logits"], out["single"]["logits"])
        for name, g in out["single"]["grads"].items():
            assert close(out["tp"]["grads"][name], g), name
        assert calls(out["tp"]) == (2, 2)
        assert "all_reduce" not in out["tp"]["collectives"]  # no exact DTensor reduction


def test_mappings_reduce_views_out_of_place():
    """reduce_from_tp on a DTensor.to_local() view inside autograd (which autograd forbids to
    modify in place), a leaf that requires grad, a slice, a transpose; a fresh output still in place."""
    for out in run_ranks("parallel.rank_jobs:reduce_views", 2, timeout=200):
        for case, result in out.items():
            assert result == "ok", (case, result)


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
        "prepare_count": "CompressedPrepareModuleInput on Two: the module got 2 positional inputs, input_layouts has 1",
    }
    for case, text in expected.items():
        assert errors[case] is not None and text in errors[case], (case, errors[case])
        assert "\n" not in errors[case], errors[case]


def test_styles_keep_the_stock_arguments():
    from torch.distributed.tensor import Partial, Replicate, Shard

    col = CompressedColwiseParallel(use_local_output=False, comm="exact")
    assert col.comm == CommConfig() and not col.use_local_output
    assert "comm=" in repr(CompressedRowwiseParallel())
    block = CompressedPrepareModuleInput(input_layouts=(Shard(1), None), input_kwarg_layouts={"h": Replicate()})
    assert block.desired_input_layouts == (Replicate(), None)
    assert block.desired_input_kwarg_layouts == {"h": Replicate()}
    assert not block.use_local_output and block.comm == comm_config(None)
    with pytest.raises(ValueError, match="the desired input layout must be Replicate"):
        CompressedPrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(0))
    with pytest.raises(ValueError, match=r"input placement .* is not supported \(Replicate or Shard\)"):
        CompressedPrepareModuleInput(input_kwarg_layouts={"h": Partial()})


def test_dp_x_tp_on_four_ranks_equals_one_process():
    for out in run_ranks("parallel.style_jobs:dp_tp", 4, dict(comm_spec="exact"), timeout=280):
        assert close(out["logits"], out["single_logits"])
        for name, g in out["single_grads"].items():
            assert close(out["grads"][name], g), name
