"""Tensor-parallel layers against one process holding the whole layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distributed import run_ranks
from fp4quant.format.config import QuantConfig
from fp4quant.parallel import CommConfig, TPCommunicator, vocab_parallel_cross_entropy


def full_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "col.w": torch.randn(32, 16, generator=g) * 0.3, "col.b": torch.randn(32, generator=g) * 0.1,
        "row.w": torch.randn(16, 32, generator=g) * 0.3, "row.b": torch.randn(16, generator=g) * 0.1,
        "emb": torch.randn(64, 16, generator=g), "head": torch.randn(64, 16, generator=g) * 0.3,
    }


def reference(full, x, labels):
    w = {k: v.clone().requires_grad_() for k, v in full.items()}
    h = F.embedding(x, w["emb"])
    h = h + F.linear(torch.relu(F.linear(h, w["col.w"], w["col.b"])), w["row.w"], w["row.b"])
    loss = F.cross_entropy(F.linear(h, w["head"]).reshape(-1, 64), labels.reshape(-1))
    loss.backward()
    return loss.detach(), {k: v.grad for k, v in w.items()}


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (3, 8), generator=g), torch.randint(0, 64, (3, 8), generator=g)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_uncompressed_tp_matches_full_layers(world, sp):
    full = full_weights()
    x, labels = inputs()
    loss, grads = reference(full, x, labels)
    results = run_ranks("parallel.rank_jobs:mlp_block", world, dict(full=full, x=x, labels=labels, sp=sp))
    n = 32 // world  # shard of col (32 outputs) and of row (32 inputs)
    for rank, r in enumerate(results):
        assert torch.allclose(r["loss"], loss, rtol=1e-5, atol=1e-6)
        lo, hi = r["rows"]
        assert torch.allclose(r["col.w"], grads["col.w"][rank * n : (rank + 1) * n], atol=1e-5)
        assert torch.allclose(r["row.w"], grads["row.w"][:, rank * n : (rank + 1) * n], atol=1e-5)
        assert torch.allclose(r["emb"], grads["emb"][lo:hi], atol=1e-5)
        assert torch.allclose(r["head"], grads["head"][lo:hi], atol=1e-5)
        if not sp:  # replicated parameters see the whole sequence
            assert torch.allclose(r["row.b"], grads["row.b"], atol=1e-5)
    if sp:  # ... or, with sequence parallelism, their shard of it: the sum over TP is the gradient
        assert torch.allclose(sum(r["row.b"] for r in results), grads["row.b"], atol=1e-5)


def test_compression_applies_to_the_directions_asked_and_stays_close():
    full = full_weights()
    x, labels = inputs()
    loss, _ = reference(full, x, labels)
    # nvfp4 pads only to 16 values: these tiny activations (384 values) do shrink on the wire
    for compress, fwd_compressed, bwd_compressed in (("fwd", True, False), ("bwd", False, True), ("both", True, True)):
        results = run_ranks("parallel.rank_jobs:mlp_block", 2,
                            dict(full=full, x=x, labels=labels, preset="nvfp4", compress=compress))
        stats = results[0]["stats"]
        for direction, compressed in (("fwd", fwd_compressed), ("bwd", bwd_compressed)):
            s = stats[direction]
            assert s["calls"] > 0
            assert (s["bytes_sent"] < s["bytes_uncompressed"]) == compressed, (compress, direction, s)
        assert torch.equal(results[0]["loss"], results[1]["loss"])  # replicas agree exactly
        assert abs(float(results[0]["loss"]) - float(loss)) < 0.05 * float(loss)


def test_bf16_preset_puts_bf16_on_the_wire():
    full = full_weights()
    x, labels = inputs()
    loss, _ = reference(full, x, labels)
    exact = run_ranks("parallel.rank_jobs:mlp_block", 2, dict(full=full, x=x, labels=labels, preset="exact"))[0]
    bf16 = run_ranks("parallel.rank_jobs:mlp_block", 2, dict(full=full, x=x, labels=labels, preset="bf16"))[0]
    for direction in ("fwd", "bwd"):
        assert bf16["stats"][direction]["bytes_sent"] * 2 == exact["stats"][direction]["bytes_sent"]
    assert float(bf16["loss"]) != float(exact["loss"]) and abs(float(bf16["loss"]) - float(loss)) < 1e-2 * float(loss)


def test_comm_config_presets():
    c = CommConfig.from_preset("fp4quant", "both")
    assert c.fwd.rounding == "nearest" and c.bwd.rounding == "stochastic" and c.bwd.scale_round == "up"
    bf16 = QuantConfig.preset("bf16")
    assert CommConfig.from_preset("bf16", "both") == CommConfig(fwd=bf16, bwd=bf16)
    assert CommConfig.from_preset("fp4quant", "none") == CommConfig(fwd=bf16, bwd=bf16)
    assert CommConfig.from_preset("fp4quant", "fwd").bwd == bf16
    assert CommConfig.from_preset("exact", "both") == CommConfig()
    with pytest.raises(ValueError, match="compress must be one of"):
        CommConfig.from_preset("fp4quant", "sideways")


def test_single_process_cross_entropy_and_virtual_group():
    logits, labels = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    tp = TPCommunicator(None)
    assert torch.allclose(vocab_parallel_cross_entropy(logits, labels, tp, 0), F.cross_entropy(logits.view(-1, 7), labels.view(-1)))
    v = TPCommunicator.virtual_group(4, 1)
    assert (v.world, v.rank) == (4, 1)
    with pytest.raises(RuntimeError, match="cannot communicate"):
        v.all_reduce(torch.zeros(2), "fwd")


def test_the_bf16_rounding_alone_rounds_where_the_wire_would_and_sends_nothing():
    """CommConfig.rounding_alone at TP = 1: the row-parallel output forward and the column-parallel
    input gradient backward are rounded to BF16 (as a TP = 2 BF16 wire rounds them), nothing else."""
    from fp4quant.parallel.mappings import copy_to_tp, reduce_from_tp

    bf16 = CommConfig.from_preset("bf16", rounding_alone=True)
    tp, plain = TPCommunicator(None, bf16), TPCommunicator(None, CommConfig.from_preset("bf16"))
    x = torch.randn(4, 8, dtype=torch.float64) * 1.001
    y = reduce_from_tp(x.clone(), tp)
    assert torch.equal(y, x.to(torch.bfloat16).to(torch.float64)) and not torch.equal(y, x)
    assert torch.equal(reduce_from_tp(x.clone(), plain), x)  # without it TP = 1 touches nothing
    leaf = x.clone().requires_grad_()
    g = torch.randn(4, 8, dtype=torch.float64)
    copy_to_tp(leaf, tp).backward(g)
    assert torch.equal(leaf.grad, g.to(torch.bfloat16).to(torch.float64))
    with pytest.raises(ValueError, match="needs a cast wire"):
        CommConfig.from_preset("fp4quant", rounding_alone=True)
