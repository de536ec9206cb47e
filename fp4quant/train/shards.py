"""This rank's shards of DTensor parameters, gradients and optimizer state, as plain tensors.

A model parallelized with PyTorch's styles (fp4quant.models.hf_tp) holds its sharded
parameters as DTensors.  The trainer computes norms and DP averages on the local shards,
and checkpoints hold plain tensors (each rank its own shard, as for the repo's own
model): ``local_tree`` before saving, ``load_local_state`` and
``restore_optimizer_placements`` after loading give the DTensors back their shards.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: in-place changes reach it), else ``t``."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_tree(obj: Any) -> Any:
    """``obj`` (nested dicts / lists / tuples) with every DTensor replaced by its local shard."""
    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: local_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_tree(v) for v in obj)
    return obj


@torch.no_grad()
def load_local_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Strict load of a ``local_tree(model.state_dict())`` into ``model`` (DTensors' shards included)."""
    own = model.state_dict(keep_vars=True)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise KeyError(f"checkpoint and model differ: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, target in own.items():
        target = local(target)
        if target.shape != state[name].shape:
            raise ValueError(f"{name}: checkpoint shard {tuple(state[name].shape)}, model {tuple(target.shape)}")
        target.copy_(state[name])


def restore_optimizer_placements(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict`` of local shards: the state of a DTensor parameter becomes
    DTensors of its placements again (scalars such as Adam's step stay plain)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor):
                continue
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() > 0:
                    if value.shape != p.to_local().shape:
                        raise ValueError(f"optimizer state {key!r}: shard {tuple(value.shape)}, "
                                         f"parameter shard {tuple(p.to_local().shape)}")
                    state[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False)
