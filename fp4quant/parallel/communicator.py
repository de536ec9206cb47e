"""TPCommunicator: the one place tensor-parallel traffic goes through.

It owns both directions: the forward all-reduce of activations after row-parallel
layers ("fwd") and the backward all-reduce of input gradients before column-parallel
layers ("bwd") -- and, with sequence parallelism, the all-gathers and reduce-scatters
that replace them.  Each direction is compressed or not on its own, with its own
QuantConfig (stochastic rounding suits gradients), and is counted under its own key in
fp4quant.comm.stats().

A direction's config is one of: None (exact: the tensor's own dtype, as PyTorch sends
it); the ``bf16`` preset (BF16 on the wire -- what a BF16 training run sends -- so a
float32 tensor is cast for the collective and back); or a compressed preset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import comm
from ..format.config import QuantConfig

COMPRESS_CHOICES = ("none", "fwd", "bwd", "both")


@dataclass(frozen=True)
class CommConfig:
    """How TP traffic is sent.  ``fwd`` / ``bwd``: the QuantConfig of each direction, or None
    for uncompressed; ``algorithm``, ``chunk_bytes`` and ``validate`` as in
    fp4quant.comm.all_reduce (validate None: the FP4QUANT_VALIDATE environment variable;
    True costs one all_gather_object per collective, so the trainer sets it for one step)."""

    fwd: QuantConfig | None = None
    bwd: QuantConfig | None = None
    algorithm: str = "two_shot"
    chunk_bytes: int | None = comm.DEFAULT_CHUNK_BYTES
    seed: int = 0
    validate: bool | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_preset(cls, preset: str, compress: str = "both", stochastic_backward: bool = True, **kwargs) -> CommConfig:
        """``preset`` applied to the directions ``compress`` names, BF16 on the wire for the
        others.  ``preset`` "exact" sends every direction uncompressed in its own dtype."""
        if compress not in COMPRESS_CHOICES:
            raise ValueError(f"compress must be one of {COMPRESS_CHOICES}, got {compress!r}")
        if preset == "exact":
            return cls(**kwargs)
        bf16 = QuantConfig.preset("bf16")
        config = QuantConfig.preset(preset)
        if not config.compressed:
            return cls(fwd=bf16, bwd=bf16, **kwargs)
        fwd = config if compress in ("fwd", "both") else bf16
        bwd = bf16
        if compress in ("bwd", "both"):
            # stochastic rounding brings its unbiased micro-scale rule (scale_round="up") with it
            bwd = config.replace(rounding="stochastic") if stochastic_backward else config
        return cls(fwd=fwd, bwd=bwd, **kwargs)


def _bf16_wire(config: QuantConfig | None, x: torch.Tensor) -> bool:
    """The bf16 preset on a wider tensor: cast it for the wire."""
    return config is not None and not config.compressed and x.dtype == torch.float32


class TPCommunicator:
    """Collectives of one tensor-parallel group.  With TP = 1 nothing is sent (and nothing compressed)."""

    def __init__(self, group: dist.ProcessGroup | None, config: CommConfig | None = None):
        self.group = group
        self.config = config or CommConfig()
        self.world = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if group is not None and dist.is_initialized() else 0
        self.virtual = False

    @classmethod
    def virtual_group(cls, world: int, rank: int = 0) -> TPCommunicator:
        """A stand-in for rank ``rank`` of a group of ``world`` that cannot communicate: for
        building models on the meta device to size them (fp4quant.models.memory)."""
        c = cls(None)
        c.world, c.rank, c.virtual = world, rank, True
        return c

    def _check_real(self) -> None:
        if self.virtual:
            raise RuntimeError("a virtual TPCommunicator (for sizing models) cannot communicate")

    def _config(self, direction: str) -> QuantConfig | None:
        return self.config.fwd if direction == "fwd" else self.config.bwd

    def all_reduce(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Sum over the group, in place; returns x."""
        self._check_real()
        if self.world == 1:
            return x
        config = self._config(direction)
        if _bf16_wire(config, x):
            wire = x.to(torch.bfloat16)
            comm.all_reduce(wire, None, self.group, direction=direction, validate=self.config.validate)
            return x.copy_(wire)
        comm.all_reduce(x, config, self.group, algorithm=self.config.algorithm, chunk_bytes=self.config.chunk_bytes,
                        direction=direction, seed=self.config.seed, validate=self.config.validate)
        return x

    def all_gather(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Concatenate the ranks' x along dim 0."""
        self._check_real()
        if self.world == 1:
            return x
        config = self._config(direction)
        if _bf16_wire(config, x):
            return self.all_gather(x.to(torch.bfloat16), direction).to(x.dtype)
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))
        comm.all_gather(out, x.contiguous(), config, self.group, chunk_bytes=self.config.chunk_bytes,
                        direction=direction, seed=self.config.seed, validate=self.config.validate)
        return out

    def reduce_scatter(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Sum over the group and keep this rank's slice of dim 0."""
        self._check_real()
        if self.world == 1:
            return x
        if x.shape[0] % self.world:
            raise ValueError(f"dim 0 ({x.shape[0]}) is not divisible by the TP size {self.world}")
        config = self._config(direction)
        if _bf16_wire(config, x):
            return self.reduce_scatter(x.to(torch.bfloat16), direction).to(x.dtype)
        out = x.new_empty((x.shape[0] // self.world, *x.shape[1:]))
        comm.reduce_scatter(out, x.contiguous(), config, self.group, chunk_bytes=self.config.chunk_bytes,
                            direction=direction, seed=self.config.seed, validate=self.config.validate)
        return out

    def all_reduce_exact(self, x: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """Uncompressed all-reduce for the small, exact reductions (softmax statistics, norms)."""
        self._check_real()
        if self.world > 1:
            dist.all_reduce(x, op=op, group=self.group)
        return x
