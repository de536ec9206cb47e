"""Per-rank memory of parameters, gradients and optimizer state, sized on the meta device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..parallel.communicator import TPCommunicator
from .model_config import ModelConfig
from .qwen2 import Qwen2ForCausalLM


@dataclass(frozen=True)
class MemoryEstimate:
    parameters: int  # held by one rank
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def memory_per_rank(cfg: ModelConfig, tp: int, param_dtype: torch.dtype = torch.float32,
                    master_weights: bool = False) -> MemoryEstimate:
    """Parameters, gradients (param dtype) and AdamW state (two float32 moments, plus a
    float32 master copy when parameters are low precision) of TP rank 0.  Activations are
    not included: they depend on the batch and on activation checkpointing."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg, TPCommunicator.virtual_group(tp), dtype=param_dtype)
    n = sum(p.numel() for p in model.parameters())
    size = torch.finfo(param_dtype).bits // 8
    optimizer = n * (8 + (4 if master_weights else 0))
    return MemoryEstimate(n, n * size, n * size, optimizer)
