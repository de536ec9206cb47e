"""Hugging Face Qwen2 / Qwen2.5 checkpoints: loaded by parameter name, sharded at load.

Each rank reads only its own slice of each sharded tensor from the safetensors files
(``safe_open(...).get_slice``), so a 7B checkpoint never has to fit in one process whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..parallel.communicator import TPCommunicator
from ..parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .model_config import ModelConfig
from .qwen2 import Qwen2ForCausalLM, RMSNorm

# A tensor source: name -> a function (row range or None) -> tensor.  Rows: the first dim.
Reader = Callable[[str], torch.Tensor]


def shard_plan(model: Qwen2ForCausalLM):
    """(parameter, HF name, how to cut the full tensor) for every parameter we hold."""
    plan = []
    seen = set()
    for name, module in model.named_modules():
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
            n = module.out_local if isinstance(module, ColumnParallelLinear) else module.vocab_local
            r = module.tp.rank
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue  # tied lm_head
                seen.add(id(p))
                plan.append((p, f"{name}.{pname}", ("rows", r * n, (r + 1) * n)))
        elif isinstance(module, RowParallelLinear):
            n, r = module.in_local, module.tp.rank
            plan.append((module.weight, f"{name}.weight", ("cols", r * n, (r + 1) * n)))
            if module.bias is not None:
                plan.append((module.bias, f"{name}.bias", ("all",)))
        elif isinstance(module, RMSNorm):
            plan.append((module.weight, f"{name}.weight", ("all",)))
    return plan


def load_state(model: Qwen2ForCausalLM, get: Callable[[str, tuple], torch.Tensor], names: set[str]) -> None:
    """Fill every parameter from ``get(hf_name, cut)``; KeyError naming what is missing."""
    plan = shard_plan(model)
    missing = [hf for _, hf, _ in plan if hf not in names]
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    with torch.no_grad():
        for p, hf, cut in plan:
            t = get(hf, cut)
            if t.shape != p.shape:
                raise ValueError(f"{hf}: checkpoint shard has shape {tuple(t.shape)}, the model expects {tuple(p.shape)}")
            p.copy_(t)


def full_shape(p: torch.Tensor, cut: tuple, world: int) -> tuple[int, ...]:
    """The unsharded shape of a parameter held as ``cut`` by one of ``world`` ranks."""
    if cut[0] == "rows":
        return (p.shape[0] * world, *p.shape[1:])
    if cut[0] == "cols":
        return (p.shape[0], p.shape[1] * world)
    return tuple(p.shape)


def _cut(t, cut):
    if cut[0] == "rows":
        return t[cut[1] : cut[2]]
    if cut[0] == "cols":
        return t[:, cut[1] : cut[2]]
    return t[:]


def load_state_dict(model: Qwen2ForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """From an in-memory full (unsharded) Hugging Face state dict."""
    load_state(model, lambda name, cut: _cut(state[name], cut), set(state))


def load_safetensors(model: Qwen2ForCausalLM, folder: str | Path) -> None:
    """From a folder of *.safetensors files (with or without model.safetensors.index.json)."""
    from safetensors import safe_open

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                where[k] = f
    handles = {}
    try:
        def get(name, cut):
            f = where[name]
            if f not in handles:
                handles[f] = safe_open(str(f), framework="pt")
            return _cut(handles[f].get_slice(name), cut)

        load_state(model, get, set(where))
    finally:
        handles.clear()


def from_pretrained(folder: str | Path, tp: TPCommunicator, sequence_parallel: bool = False,
                    activation_checkpointing: bool = False, device=None, dtype=None) -> Qwen2ForCausalLM:
    """Build the model a Hugging Face folder describes (config.json) and load its weights."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {folder}: not a Hugging Face model folder")
    cfg = ModelConfig.from_hf(json.loads(config_path.read_text()))
    model = Qwen2ForCausalLM(cfg, tp, sequence_parallel, activation_checkpointing, device=device, dtype=dtype)
    load_safetensors(model, folder)
    return model


def check_no_unused(model: nn.Module, names: set[str]) -> list[str]:
    """Checkpoint tensors the model does not use (e.g. rotary caches of old exports)."""
    used = {hf for _, hf, _ in shard_plan(model)}
    return sorted(n for n in names if n not in used and not n.endswith("rotary_emb.inv_freq") and n != "lm_head.weight")
