"""fp4quant.parallel.hf_plan on small Hugging Face Qwen2 and Llama models (gloo, TP = 2)."""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)

LAYERS = 2  # parallel.hf_jobs.tiny


def close(a, b, tol=1e-5):
    return torch.allclose(a, b, rtol=tol, atol=tol)


def calls(out) -> tuple[int, int]:
    return tuple(out["stats"].get(d, {}).get("calls", 0) for d in ("fwd", "bwd"))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tp_plan_and_registered_styles_equal_one_process_and_stock(arch):
    for out in run_ranks("parallel.hf_jobs:forward_backward", 2, dict(arch=arch), timeout=280):
        single = out["single"]
        for kind in ("stock", "tp_plan", "per_projection", "registry"):
            assert close(out[kind]["logits"], single["logits"]), kind
            for name, g in single["grads"].items():
                assert close(out[kind]["grads"][name], g), (kind, name)
        # per decoder layer: o_proj and down_proj forward; backward the attention block's input
        # (q, k, v's summed gradients) and the MLP block's (gate, up): 2, as Megatron's
        for kind in ("tp_plan", "registry"):
            assert calls(out[kind]) == (2 * LAYERS, 2 * LAYERS), kind
            # and nothing else crosses the wire: the exact wire's all-reduces are those, DTensor sends nothing
            assert out[kind]["collectives"] == {"allreduce_": 4 * LAYERS}, (kind, out[kind]["collectives"])
        # block_inputs=False: each of q, k, v, gate, up reduces its own input gradient
        assert calls(out["per_projection"]) == (2 * LAYERS, 5 * LAYERS)


def test_qwen2_backward_sends_at_most_1_25x_the_forward():
    """One training step of a tiny Qwen2 at TP = 2 under fp4quant: the backward's compressed
    bytes are the forward's (2 all-reduces of the hidden state per layer each way), where the
    per-projection plan sends 2.5x."""
    ranks = {blocks: run_ranks("parallel.hf_jobs:train_step_traffic", 2, dict(block_inputs=blocks), timeout=280)
             for blocks in (True, False)}
    stats = {blocks: r[0]["stats"] for blocks, r in ranks.items()}
    fwd, bwd = stats[True]["fwd"], stats[True]["bwd"]
    assert (fwd["calls"], bwd["calls"]) == (2 * LAYERS, 2 * LAYERS)
    assert all(0 < s["bytes_sent"] < s["bytes_uncompressed"] / 4 for s in (fwd, bwd))  # compressed both ways
    assert bwd["bytes_sent"] <= 1.25 * fwd["bytes_sent"]
    old = stats[False]
    assert old["bwd"]["bytes_sent"] == pytest.approx(2.5 * old["fwd"]["bytes_sent"], rel=0.01)
    assert old["fwd"]["bytes_sent"] == fwd["bytes_sent"]  # the forward is the same either way
    assert ranks[True][0]["loss"] == ranks[True][1]["loss"]  # every rank decodes the same bytes


def test_tp_plan_prepares_each_block_input_once():
    from fp4quant.parallel import CompressedColwiseParallel, CompressedPrepareModuleInput, tp_plan
    from parallel.hf_jobs import tiny

    model = tiny("qwen2")
    plan = tp_plan(model, comm="exact")
    attention, mlp = plan["model.layers.*.self_attn"], plan["model.layers.*.mlp"]
    assert isinstance(attention, CompressedPrepareModuleInput) and isinstance(mlp, CompressedPrepareModuleInput)
    assert set(attention.input_kwarg_layouts) == {"hidden_states"} and attention.input_layouts is None
    assert len(mlp.input_layouts) == 1 and not attention.use_local_output
    assert list(plan).index("model.layers.*.self_attn") < list(plan).index("model.layers.*.self_attn.q_proj")
    assert isinstance(plan["model.layers.*.mlp.up_proj"], CompressedColwiseParallel)
    old = tp_plan(model, block_inputs=False)
    assert set(plan) - set(old) == {"model.layers.*.self_attn", "model.layers.*.mlp"}
    assert not any(isinstance(s, CompressedPrepareModuleInput) for s in old.values())


def test_a_tp_size_that_does_not_divide_the_heads_is_refused():
    for message in run_ranks("parallel.hf_jobs:heads_error", 2, timeout=200):
        assert message is not None and "the TP size 2 does not divide the 1 key-value heads" in message


def test_a_model_without_a_plan_is_refused():
    from fp4quant.parallel import tp_plan

    with pytest.raises(ValueError, match="no config.base_model_tp_plan"):
        tp_plan(torch.nn.Linear(2, 2))
