"""fp4quant.parallel.hf_plan on small Hugging Face Qwen2 and Llama models (gloo, TP = 2)."""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)


def close(a, b, tol=1e-5):
    return torch.allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tp_plan_and_registered_styles_equal_one_process_and_stock(arch):
    for out in run_ranks("parallel.hf_jobs:forward_backward", 2, dict(arch=arch), timeout=280):
        single = out["single"]
        for kind in ("stock", "tp_plan", "registry"):
            assert close(out[kind]["logits"], single["logits"]), kind
            for name, g in single["grads"].items():
                assert close(out[kind]["grads"][name], g), (kind, name)
        # 2 layers: o_proj, down_proj forward; q, k, v, gate, up backward (each its own input
        # gradient, as the stock styles reduce them)
        for kind in ("tp_plan", "registry"):
            stats = out[kind]["stats"]
            assert stats["fwd"]["calls"] == 4 and stats["bwd"]["calls"] == 10, (kind, stats)


def test_a_tp_size_that_does_not_divide_the_heads_is_refused():
    for message in run_ranks("parallel.hf_jobs:heads_error", 2, timeout=200):
        assert message is not None and "the TP size 2 does not divide the 1 key-value heads" in message


def test_a_model_without_a_plan_is_refused():
    from fp4quant.parallel import tp_plan

    with pytest.raises(ValueError, match="no config.base_model_tp_plan"):
        tp_plan(torch.nn.Linear(2, 2))
