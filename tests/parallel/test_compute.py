"""The linear layers' compute: exact by default, Quartet's FP4 GEMMs when attached, composed
with compressed TP, reproducible across a resume."""

from __future__ import annotations

import pytest
import torch

from fp4quant.models import ModelConfig, Qwen2ForCausalLM
from fp4quant.parallel import ComputeConfig, LinearCompute, TPCommunicator
from fp4quant.parallel.layers import ColumnParallelLinear, RowParallelLinear
from fp4quant.reference.quartet import quartet_linear
from fp4quant.train import ConfigError, TrainConfig


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(ModelConfig.preset("tiny"), TPCommunicator(None))


def test_exact_compute_changes_nothing():
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    plain, attached = tiny_model(), tiny_model()
    LinearCompute(ComputeConfig("exact")).attach(attached.model)
    assert torch.equal(plain.loss(ids, ids), attached.loss(ids, ids))


def test_quartet_is_attached_to_every_block_linear_but_not_the_head():
    model = tiny_model()
    compute = LinearCompute(ComputeConfig("quartet"))
    assert compute.attach(model.model) == 7 * model.cfg.num_layers  # q k v o gate up down
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert [m.compute_index for m in linears if m.compute is compute] == list(range(7 * model.cfg.num_layers))
    assert model.lm_head.compute is None


def test_a_layer_calls_quartet_with_its_own_stream():
    model = tiny_model()
    compute = LinearCompute(ComputeConfig("quartet", seed=5), rank=1)
    compute.attach(model.model)
    compute.start_step(3)
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(2, 8, model.cfg.hidden_size)
    seed = LinearCompute(ComputeConfig("quartet", seed=5), rank=1)
    seed.calls = [0] * len(compute.calls)
    seed.start_step(3)
    want = quartet_linear(x, layer.weight, layer.bias, seed.seed(layer.compute_index))
    assert torch.equal(layer(x), want)
    # the next call of this layer draws the next stream; other layers' calls do not move it
    model.model.layers[1].mlp.up_proj(x)
    assert compute.calls[layer.compute_index] == 1 and compute.seed(layer.compute_index) == seed.seed(layer.compute_index)


def test_streams_differ_by_step_rank_layer_and_call_and_repeat_by_step():
    def seeds(rank, step):
        c = LinearCompute(ComputeConfig("quartet"), rank=rank)
        c.calls = [0, 0]
        c.start_step(step)
        return [c.seed(0), c.seed(0), c.seed(1)]

    a = seeds(0, 0)
    assert len(set(a + seeds(1, 0) + seeds(0, 1))) == 9
    assert seeds(0, 1) == seeds(0, 1)


def test_bad_compute_is_one_line():
    with pytest.raises(ValueError, match="compute must be one of"):
        ComputeConfig("fp4")
    with pytest.raises(ConfigError, match="--compute must be one of"):
        TrainConfig(out="x", compute="bf16")
