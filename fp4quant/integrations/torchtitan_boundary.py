"""The TP boundaries of fp4quant.integrations.torchtitan: which redistributions of a torchtitan
ShardingConfig are TP-axis collectives, of which kind, and the autograd function that sends them
through an fp4quant TPCommunicator (forward collectives as one custom op, so that activation
checkpointing can keep their results)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import spmd_types as spmd
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torchtitan.distributed.parallel_dims import MeshAxisName
from torchtitan.protocols.sharding import ShardingConfig, SpmdLayout

from ..parallel.communicator import TPCommunicator

TP = MeshAxisName.TP
OP_NAME = "fp4quant_torchtitan::tp_collective"


class UnsupportedConfig(RuntimeError):
    """What this integration cannot compress, said in one line."""


# ---- the forward collectives: one custom op, so that AC's cache can keep their results ------
# (a functional op that allocates its result: AC's cache cannot keep an in-place reduce_from_tp)

_COMMUNICATORS: list[TPCommunicator] = []  # the custom op's int handle -> its communicator


def _handle(tp: TPCommunicator) -> int:
    for i, known in enumerate(_COMMUNICATORS):
        if known is tp:
            return i
    _COMMUNICATORS.append(tp)
    return len(_COMMUNICATORS) - 1


def _collective(tp: TPCommunicator, kind: str, x: torch.Tensor, dim: int, direction: str) -> torch.Tensor:
    """A new contiguous tensor: ``x`` all-reduced, or all-gathered / reduce-scattered along ``dim``."""
    if kind == "all_reduce":
        return tp.all_reduce(x.clone(memory_format=torch.contiguous_format), direction)
    moved = x.movedim(dim, 0).contiguous()
    out = tp.all_gather(moved, direction) if kind == "all_gather" else tp.reduce_scatter(moved, direction)
    return out.movedim(0, dim).contiguous()


_warned = {"recompute": False}


@torch.library.custom_op(OP_NAME, mutates_args=())
def tp_collective(x: torch.Tensor, handle: int, kind: str, dim: int, direction: str) -> torch.Tensor:
    """The forward-direction collective ``kind`` of communicator ``handle`` on ``x`` (a new tensor)."""
    if torch._C._current_graph_task_id() != -1 and not _warned["recompute"]:
        # a forward collective sent while autograd runs a backward: activation checkpointing's recompute
        _warned["recompute"] = True
        warnings.warn("fp4quant/torchtitan: activation checkpointing re-sends the compressed forward collectives "
                      "in its recompute; add fp4quant.integrations.torchtitan.selective_ac (or full_ac) to "
                      "override.imports to keep their results instead", stacklevel=2)
    return _collective(_COMMUNICATORS[handle], kind, x, dim, direction)


@tp_collective.register_fake
def _(x, handle, kind, dim, direction):
    shape = list(x.shape)
    world = _COMMUNICATORS[handle].world
    if kind == "all_gather":
        shape[dim] *= world
    elif kind == "reduce_scatter":
        shape[dim] //= world
    return x.new_empty(shape)


OP = torch.ops.fp4quant_torchtitan.tp_collective.default

exact_fallbacks = {"count": 0}  # DTensor gradients redistributed by DTensor (an unexpected placement)


# ---- one TP boundary of a module ------------------------------------------------------------


@dataclass(frozen=True)
class _Boundary:
    """One TP-axis redistribution of a module, through fp4quant.

    kind  copy    I -> R     forward identity           backward all-reduce ("bwd")
          gather  S(d) -> R  forward all-gather ("fwd")  backward reduce-scatter ("bwd")
          reduce  P -> I     forward all-reduce ("fwd")  backward identity
          scatter P -> S(d)  forward reduce-scatter ("fwd")  backward all-gather ("bwd")
    src / dst: the DTensor placements on the 1-D TP mesh (``mesh``), or None under spmd_types
    (plain local tensors); ``dst_layout``: the SpmdLayout the output takes (for spmd_types'
    type checking).
    """

    kind: str
    dim: int
    tp: TPCommunicator
    handle: int
    mesh: Any
    src: Any
    dst: Any
    dst_layout: SpmdLayout | None
    what: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _apply(x, self)

    # local tensors
    def forward_local(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        if self.kind == "copy":
            return x.view_as(x)
        kind = {"gather": "all_gather", "reduce": "all_reduce", "scatter": "reduce_scatter"}[self.kind]
        return OP(x, self.handle, kind, dim, "fwd")

    def backward_local(self, g: torch.Tensor) -> torch.Tensor:
        dim = self.dim % g.dim()
        if self.kind == "copy":
            return _collective(self.tp, "all_reduce", g, 0, "bwd")
        if self.kind == "gather":
            return _collective(self.tp, "reduce_scatter", g, dim, "bwd")
        if self.kind == "scatter":
            return _collective(self.tp, "all_gather", g, dim, "bwd")
        return g  # reduce: identity

    # DTensor gradients (partial_dtensor): what to send follows the gradient's placement
    def backward_dtensor(self, g: DTensor) -> DTensor:
        placement = g.placements[0]
        partial = isinstance(placement, Partial) and getattr(placement, "reduce_op", "sum") == "sum"
        dim = self.dim % g.dim()
        if self.kind == "reduce":
            return g
        if self.kind == "copy":
            if partial:
                return self._wrap(self.backward_local(g.to_local()), Replicate())
            if placement.is_replicate():
                return g
            return self._fallback(g, Replicate())
        if self.kind == "gather":
            if partial:
                return self._wrap(self.backward_local(g.to_local()), Shard(dim))
            if placement.is_replicate():
                local = g.to_local()
                n = local.shape[dim] // self.tp.world
                return self._wrap(local.narrow(dim, self.tp.rank * n, n).contiguous(), Shard(dim))
            return self._fallback(g, Shard(dim))
        # scatter
        if isinstance(placement, Shard) and placement.dim % g.dim() == dim:
            return self._wrap(self.backward_local(g.to_local()), Replicate())
        if placement.is_replicate() or partial:
            return g
        return self._fallback(g, Replicate())

    def _wrap(self, local: torch.Tensor, placement) -> DTensor:
        return DTensor.from_local(local, self.mesh, (placement,), run_check=False)

    @staticmethod
    def _fallback(g: DTensor, placement) -> DTensor:
        exact_fallbacks["count"] += 1
        return g.redistribute(placements=(placement,))


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, boundary: _Boundary):
        ctx.boundary = boundary
        if isinstance(x, DTensor):
            if x.device_mesh.ndim != 1 or x.placements[0] != boundary.src:
                raise UnsupportedConfig(f"fp4quant/torchtitan: {boundary.what}: expected a DTensor on the 1-D TP "
                                        f"mesh placed {boundary.src}, got {tuple(x.placements)} on a "
                                        f"{x.device_mesh.ndim}-D mesh")
            out = boundary.forward_local(x.to_local())
            return DTensor.from_local(out, x.device_mesh, (boundary.dst,), run_check=False)
        return boundary.forward_local(x)

    @staticmethod
    def backward(ctx, g):
        boundary = ctx.boundary
        if isinstance(g, DTensor):
            return boundary.backward_dtensor(g), None
        return boundary.backward_local(g), None


@torch.compiler.disable  # the collectives run eagerly, in call order: the streams stay the eager run's
def _apply(x: torch.Tensor, boundary: _Boundary) -> torch.Tensor:
    if boundary.dst_layout is None:  # DTensor backend
        return _Apply.apply(x, boundary)
    checking = spmd.is_type_checking()
    with spmd.no_typecheck():
        out = _Apply.apply(x, boundary)
    if checking:
        spmd.assert_type(out, boundary.dst_layout.axis_types, boundary.dst_layout.partition_spec)
    return out


# ---- which redistributions are TP boundaries, and of which kind ----------------------------


def _kind(src: SpmdLayout, dst: SpmdLayout, what: str) -> tuple[str, int] | None:
    """(kind, dim) of the TP-axis change src -> dst; None when the TP axis does not change."""
    src_types, dst_types = src.per_axis_spmd_types(), dst.per_axis_spmd_types()
    s, d = src_types.get(TP), dst_types.get(TP)
    if s is None or d is None or s == d:
        return None
    others = [a for a in set(src_types) | set(dst_types) if a != TP and src_types.get(a) != dst_types.get(a)]
    if others:
        raise UnsupportedConfig(f"fp4quant/torchtitan: {what}: the redistribution changes the TP axis and "
                                f"{sorted(a.value for a in others)} at once ({src_types} -> {dst_types})")
    if s is spmd.I and d is spmd.R:
        return "copy", 0
    if isinstance(s, spmd.Shard) and d is spmd.R:
        return "gather", s.dim
    if s is spmd.P and d is spmd.I:
        return "reduce", 0
    if s is spmd.P and isinstance(d, spmd.Shard):
        return "scatter", d.dim
    if s is spmd.R and d is spmd.I:  # nothing sent either way
        return None
    raise UnsupportedConfig(f"fp4quant/torchtitan: {what}: TP redistribution {s} -> {d} is not supported "
                            f"(I -> R, S(d) -> R, P -> I, P -> S(d))")


def _boundaries(config: ShardingConfig, what: str):
    """The TP boundaries a ShardingConfig declares: {input name: (src, dst, kind, dim)} and the
    output's (src, dst, kind, dim) or None."""
    inputs = {}
    in_dst = config.in_dst_shardings or {}
    for name, src in (config.in_src_shardings or {}).items():
        dst = in_dst.get(name)
        if dst is not None and (k := _kind(src, dst, f"{what} input {name!r}")) is not None:
            inputs[name] = (src, dst, *k)
    output = None
    src, dst = config.out_src_shardings, config.out_dst_shardings
    if isinstance(src, SpmdLayout) and dst is not None and (k := _kind(src, dst, f"{what} output")) is not None:
        output = (src, dst, *k)
    return inputs, output


def has_tp_boundary(config: ShardingConfig | None) -> bool:
    if config is None:
        return False
    inputs, output = _boundaries(config, "")
    return bool(inputs) or output is not None
