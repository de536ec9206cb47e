"""Bodies of the multi-rank tests of fp4quant.parallel.hf_plan (run by distributed.run_ranks)."""

from __future__ import annotations

import copy

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from fp4quant import comm
from fp4quant.parallel import register_transformers_styles, start_step, tp_plan
from parallel.style_jobs import step_results, traced_results

VOCAB = 128


def tiny(arch: str, kv_heads: int = 2, seed: int = 0):
    """A small Hugging Face Qwen2 / Llama built from its config (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return model_cls(config).float()


class Logits(torch.nn.Module):
    """model(ids) -> logits, for step_results."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def batch(seed=1, b=2, t=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, t), generator=g), torch.randint(0, VOCAB, (b, t), generator=g)


def stock_plan(model):
    names = model.config.base_model_tp_plan
    return {f"model.{n}": ColwiseParallel() if s == "colwise" else RowwiseParallel() for n, s in names.items()}


def registry_plan(base) -> dict[str, str]:
    """The config's plan in the registered names, with the block inputs of its attention and MLP."""
    names = {n: f"fp4quant_{s}" for n, s in base.config.base_model_tp_plan.items()}
    return {"layers.*.self_attn": "fp4quant_attention_input", "layers.*.mlp": "fp4quant_mlp_input", **names}


def forward_backward(rank, world, arch, comm_spec="exact"):
    """One process's whole model, the stock styles on the config's plan, tp_plan (block-level
    inputs, and per projection), and the names registered with transformers' registry (applied
    as from_pretrained applies a tp_plan)."""
    from transformers.distributed.parallel_utils import replace_layer_number_by_wildcard
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    mesh = init_device_mesh("cpu", (world,))
    ids, labels = batch()
    base = tiny(arch)
    out = {"single": step_results(Logits(copy.deepcopy(base)), ids, labels)}
    out["stock"] = step_results(Logits(parallelize_module(copy.deepcopy(base), mesh, stock_plan(base))), ids, labels)
    for kind, blocks in (("tp_plan", True), ("per_projection", False)):
        model = parallelize_module(copy.deepcopy(base), mesh, tp_plan(base, comm=comm_spec, block_inputs=blocks))
        out[kind] = traced_results(Logits(model), ids, labels)
    names = register_transformers_styles(comm_spec)
    hf_names = registry_plan(base)
    assert set(hf_names.values()) <= set(names)
    registered = copy.deepcopy(base)
    concrete = {}  # what from_pretrained hands apply_tensor_parallelism: a module's own parameters, then the module
    for name, module in registered.named_modules():
        style = hf_names.get(replace_layer_number_by_wildcard(name).removeprefix("model."))
        if style:
            concrete.update({f"{name}.{p}": style for p, _ in module.named_parameters(recurse=False)} | {name: style})
    apply_tensor_parallelism(registered, mesh, concrete)
    out["registry"] = traced_results(Logits(registered), ids, labels)
    return out


def train_step_traffic(rank, world, arch="qwen2", comm_spec="fp4quant", block_inputs=True):
    """The compressed traffic of one training step (forward, backward, optimizer step) at TP = world."""
    mesh = init_device_mesh("cpu", (world,))
    ids, labels = batch(b=4, t=32)
    model = parallelize_module(tiny(arch), mesh, tp_plan(tiny(arch), comm=comm_spec, block_inputs=block_inputs))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    comm.reset_stats()
    start_step(model, 0)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    return {"loss": float(loss), "stats": comm.stats()}


def heads_error(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    model = tiny("qwen2", kv_heads=1)
    try:
        parallelize_module(model, mesh, tp_plan(model))
    except ValueError as exc:
        return str(exc)
    return None
