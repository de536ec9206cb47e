"""Deterministic initialization that does not depend on the tensor-parallel layout.

Every parameter's full (unsharded) tensor is drawn from a generator seeded by (seed,
parameter name), and each rank keeps its shard: TP = 1 and TP = 4 start from the same
model, one full tensor in memory at a time.  Distributions as Qwen2's: weights and
embeddings N(0, 0.02), biases 0, norms 1.
"""

from __future__ import annotations

import hashlib

import torch

from .hf import _cut, full_shape, shard_plan
from .qwen2 import Qwen2ForCausalLM

STD = 0.02


def _seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


@torch.no_grad()
def initialize(model: Qwen2ForCausalLM, seed: int) -> None:
    world = model.tp.world
    for p, name, cut in shard_plan(model):
        shape = full_shape(p, cut, world)
        if name.endswith("norm.weight"):
            full = torch.ones(shape)
        elif name.endswith(".bias"):
            full = torch.zeros(shape)
        else:
            g = torch.Generator().manual_seed(_seed(seed, name))
            full = torch.randn(shape, generator=g) * STD
        p.copy_(_cut(full, cut))
