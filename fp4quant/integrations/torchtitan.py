"""torchtitan: the TP traffic of its models through one fp4quant TPCommunicator.

A torchtitan ``Module`` carries a ``ShardingConfig``; ``parallelize`` wraps its forward in
``_redistribute_inputs`` / ``_redistribute_outputs``, which issue the TP collectives.  The
overrides below, through torchtitan's own ``--override.imports`` (no fork, nothing patched),
replace the configs of the attention and feed-forward blocks, the token embedding and the
final norm by subclasses whose TP-axis redistributions go through fp4quant::

    --override.imports \
        fp4quant.integrations.torchtitan.attention fp4quant.integrations.torchtitan.feed_forward \
        fp4quant.integrations.torchtitan.embedding fp4quant.integrations.torchtitan.output_norm \
        fp4quant.integrations.torchtitan.selective_ac

or ``config.override.imports = [...]`` (``OVERRIDES`` holds the four model ones).  ``full_ac``
replaces ``selective_ac`` with ``--activation_checkpoint full``; none with ``none``.  With torch
2.13 add ``--parallelism.spmd_backend partial_dtensor``.  A model override takes ``comm`` (a
preset or "exact"; default "fp4quant"), ``compress`` ("both", "fwd", "bwd", "none") and ``seed``
as JSON: ``'fp4quant.integrations.torchtitan.feed_forward={"comm": "exact"}'``; equal arguments
share one TPCommunicator (kept on the TP DeviceMesh).  ``start_step(model, step)`` before a step
(e.g. in a Trainer subclass's ``train_step``) keys the stochastic-rounding streams by the step;
without it a call counter keys them (reproducible from a run's start, not across a resume).

Through fp4quant, as llama3's ShardingConfigs declare it: the attention / feed-forward block
inputs and the final norm's output before ``lm_head``, ``I -> R`` (backward all-reduce) or with
sequence parallelism ``S(1) -> R`` (all-gather; backward reduce-scatter); the outputs of ``wo``,
``w2`` and the vocab-parallel embedding, ``P -> I`` (all-reduce) or ``P -> S(1)``
(reduce-scatter; backward all-gather).  The AC overrides keep the forward collectives' results
for the recompute.  Stays stock: the loss-parallel cross entropy's reductions, the replicated
norm weights' gradient all-reduces, FSDP, other mesh axes.

Refused, in one line each (``UnsupportedConfig``): ``spmd_backend="full_dtensor"``; a TP
redistribution other than those four (e.g. an all-to-all); one changing several mesh axes; the
dist-GEMM TP backend (its collectives are fused into the GEMMs); a model config with no TP
boundary.  A DTensor gradient placed otherwise than expected is redistributed by DTensor,
exactly, and counted in ``exact_fallbacks``.

Tested with torchtitan 0.3.0 and torch 2.13 on CPU / gloo, TP = 2, on llama3 (qwen3's and
deepseek-v3's dense layers use the same helpers, untested); not tested: spmd_types type checking,
torch.compile, pipeline and context parallelism, MoE.  Call counts, losses, AC's memory cost
and where the results differ from stock: docs/results/integrations.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import warnings
from dataclasses import dataclass
from typing import Any

import spmd_types as spmd
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torchtitan.config import derive, override
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.distributed.parallel_dims import MeshAxisName
from torchtitan.models.common.attention import GQAttention
from torchtitan.models.common.embedding import Embedding
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import ShardingConfig, SpmdLayout, resolve_placements

from ..parallel.communicator import CommConfig, TPCommunicator
from ..parallel.styles import MODULE_ATTRIBUTE, communicator, start_step

__all__ = [
    "OP",
    "OVERRIDES",
    "TESTED_VERSIONS",
    "UnsupportedConfig",
    "attention",
    "compressed_class",
    "compressed_config",
    "embedding",
    "exact_fallbacks",
    "feed_forward",
    "full_ac",
    "output_norm",
    "selective_ac",
    "start_step",
]

TESTED_VERSIONS = ("0.3.0",)


def torchtitan_version() -> str:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:  # a source checkout
        return "unknown"


if torchtitan_version() not in TESTED_VERSIONS:
    warnings.warn(f"fp4quant.integrations.torchtitan was tested with torchtitan {', '.join(TESTED_VERSIONS)}, "
                  f"not {torchtitan_version()}", stacklevel=2)
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


# ---- the compressed modules -------------------------------------------------------------------


def comm_of(comm: str, compress: str, seed: int) -> CommConfig:
    """The CommConfig of an override's arguments (a preset, "exact" included)."""
    return CommConfig.from_preset(comm, compress, seed=seed)


class _CompressedTP:
    """Mixin of a torchtitan Module: its TP-axis redistributions go through fp4quant.

    After the stock ``parallelize`` (states sharded, forward wrapped), the TP boundaries of the
    module's ShardingConfig become fp4quant boundaries, and the config the stock wrapper reads
    at call time keeps only their other-axis parts (the stock code still wraps plain tensors as
    DTensors and checks placements and types).
    """

    def __init__(self, config):
        super().__init__(config)
        self.fp4quant_comm = comm_of(config.fp4quant_comm, config.fp4quant_compress, config.fp4quant_seed)
        self._fp4quant_inputs: dict[str, _Boundary] = {}
        self._fp4quant_output: _Boundary | None = None

    def parallelize(self, parallel_dims) -> None:
        super().parallelize(parallel_dims)
        if self._sharding_config is None or not parallel_dims.tp_enabled:
            return
        backend = parallel_dims.spmd_backend
        what = type(self).__name__
        if backend not in ("partial_dtensor", "spmd_types"):
            raise UnsupportedConfig(f"fp4quant/torchtitan: spmd_backend={backend!r} is not supported "
                                    f"(partial_dtensor or spmd_types)")
        config = self._sharding_config
        inputs, output = _boundaries(config, what)
        tp_mesh = parallel_dims.get_mesh("tp")
        tp = communicator(tp_mesh, self.fp4quant_comm)
        setattr(self, MODULE_ATTRIBUTE, tp)
        handle = _handle(tp)

        def boundary(src: SpmdLayout, dst: SpmdLayout, kind: str, dim: int, name: str) -> _Boundary:
            if backend == "spmd_types":
                return _Boundary(kind, dim, tp, handle, None, None, None, dst, name)
            mesh = parallel_dims.resolve_shared_mesh([src, dst])
            if mesh is None or mesh.ndim != 1 or tuple(mesh.mesh_dim_names or ()) != ("tp",):
                raise UnsupportedConfig(f"fp4quant/torchtitan: {name}: the redistribution's DTensor mesh is not the "
                                        f"1-D TP mesh ({None if mesh is None else mesh.mesh_dim_names})")
            (s,), (d,) = resolve_placements(src, mesh), resolve_placements(dst, mesh)
            return _Boundary(kind, dim, tp, handle, mesh, s, d, None, name)

        in_dst = dict(config.in_dst_shardings or {})
        for name, (src, dst, kind, dim) in inputs.items():
            self._fp4quant_inputs[name] = boundary(src, dst, kind, dim, f"{what} input {name!r}")
            in_dst[name] = src  # the stock wrapper leaves it as it is; fp4quant redistributes it
        out_dst = config.out_dst_shardings
        if output is not None:
            src, dst, kind, dim = output
            self._fp4quant_output = boundary(src, dst, kind, dim, f"{what} output")
            out_dst = None
        self._sharding_config = dataclasses.replace(config, in_dst_shardings=in_dst or None, out_dst_shardings=out_dst)

    def _redistribute_inputs(self, parallel_dims, args: tuple, kwargs: dict):
        args, kwargs = super()._redistribute_inputs(parallel_dims, args, kwargs)
        if not self._fp4quant_inputs:
            return args, kwargs
        names = [n for n in self._cache_pos_arg_names() if n not in kwargs][: len(args)]
        args = list(args)
        for i, name in enumerate(names):
            if name in self._fp4quant_inputs and isinstance(args[i], torch.Tensor):
                args[i] = self._fp4quant_inputs[name](args[i])
        kwargs = {k: self._fp4quant_inputs[k](v) if k in self._fp4quant_inputs and isinstance(v, torch.Tensor) else v
                  for k, v in kwargs.items()}
        return tuple(args), kwargs

    def _redistribute_outputs(self, parallel_dims, outputs):
        outputs = super()._redistribute_outputs(parallel_dims, outputs)
        if self._fp4quant_output is not None and isinstance(outputs, torch.Tensor):
            outputs = self._fp4quant_output(outputs)
        return outputs


_CLASSES: dict[type, type] = {}


def compressed_class(owner: type) -> type:
    """``owner`` (a torchtitan Module) with its TP boundaries through fp4quant: a subclass named
    ``FP4<owner>``, with a Config that adds ``fp4quant_comm``, ``fp4quant_compress`` and
    ``fp4quant_seed`` (one per owner class, made on first use)."""
    if issubclass(owner, _CompressedTP):
        return owner
    if owner not in _CLASSES:
        name = f"FP4{owner.__name__}"
        namespace = {"__annotations__": {"fp4quant_comm": str, "fp4quant_compress": str, "fp4quant_seed": int},
                     "fp4quant_comm": "fp4quant", "fp4quant_compress": "both", "fp4quant_seed": 0,
                     "__module__": __name__, "__qualname__": f"{name}.Config"}
        config_cls = dataclass(kw_only=True, slots=True)(type("Config", (owner.Config,), namespace))
        cls = type(name, (_CompressedTP, owner), {"Config": config_cls, "__module__": __name__,
                                                    "__qualname__": name, "__doc__": _CompressedTP.__doc__})
        _CLASSES[owner] = cls
    return _CLASSES[owner]


def _owner(config) -> type:
    owner = type(config)._owner
    if owner is None or not issubclass(owner, Module):
        raise UnsupportedConfig(f"fp4quant/torchtitan: {type(config).__qualname__} builds no torchtitan Module")
    return owner


def compressed_config(config, comm: str = "fp4quant", compress: str = "both", seed: int = 0, fqn: str = ""):
    """``config`` and every module config under it that declares a TP boundary, replaced by the
    configs of their compressed classes (the replacement the overrides make).  Refuses a config
    none of whose nodes has a TP boundary (nothing to compress: the sharding configs are set by
    the model's ``update_from_config``, which torchtitan runs before the overrides)."""
    comm_of(comm, compress, seed)  # refuses a bad preset here, not at build time
    found = []

    def convert(cfg):
        owner = _owner(cfg)
        _check_supported(owner)
        if not has_tp_boundary(getattr(cfg, "sharding_config", None)):
            return cfg
        found.append(owner.__name__)
        return derive(cfg, compressed_class(owner).Config, fp4quant_comm=comm, fp4quant_compress=compress,
                      fp4quant_seed=seed)

    # children before their parents: a parent's derived copy then holds its replaced children
    for _, child, parent, attr in reversed(list(config.traverse(Module.Config, recurse=True))[1:]):
        new = convert(child)
        if new is not child:
            if isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
    result = convert(config)
    if not found:
        raise UnsupportedConfig(f"fp4quant/torchtitan: {fqn or type(config).__qualname__} declares no TP "
                                f"redistribution (is the model's sharding config set?)")
    return result


def _check_supported(owner: type) -> None:
    try:
        from torchtitan.models.common.dist_gemm import (
            AllGatherFusedFeedForward,
            AllGatherFusedQKVLinear,
            RowParallelLinear,
        )
    except ImportError:  # pragma: no cover - another torchtitan
        return
    if issubclass(owner, (RowParallelLinear, AllGatherFusedFeedForward, AllGatherFusedQKVLinear)):
        raise UnsupportedConfig(f"fp4quant/torchtitan: {owner.__name__} (the dist-GEMM TP backend) sends its "
                                f"collectives inside its GEMMs; use tp_gemm_backend='default'")


# ---- the overrides ----------------------------------------------------------------------------


@override(target=GQAttention.Config, description="fp4quant: the attention block's TP collectives compressed")
def attention(cfg, comm: str = "fp4quant", compress: str = "both", seed: int = 0):
    return compressed_config(cfg, comm, compress, seed, "attention")


@override(target=FeedForward.Config, description="fp4quant: the feed-forward block's TP collectives compressed")
def feed_forward(cfg, comm: str = "fp4quant", compress: str = "both", seed: int = 0):
    return compressed_config(cfg, comm, compress, seed, "feed_forward")


@override(target=Embedding.Config, fqns=["tok_embeddings", "*.tok_embeddings"],
          description="fp4quant: the vocab-parallel embedding's output reduction compressed")
def embedding(cfg, comm: str = "fp4quant", compress: str = "both", seed: int = 0):
    return compressed_config(cfg, comm, compress, seed, "tok_embeddings")


@override(target=RMSNorm.Config, fqns=["norm", "*model.norm"],
          description="fp4quant: the final norm's gather before lm_head (and its gradient's reduction)")
def output_norm(cfg, comm: str = "fp4quant", compress: str = "both", seed: int = 0):
    return compressed_config(cfg, comm, compress, seed, "norm")


def _save_fp4quant_collectives(ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if func is OP else CheckpointPolicy.PREFER_RECOMPUTE


class FP4SelectiveAC(SelectiveAC):
    """torchtitan's selective AC that also saves fp4quant's forward collectives (never re-sent)."""

    @dataclass(kw_only=True, slots=True)
    class Config(SelectiveAC.Config):
        pass

    def get_save_ops(self) -> set:
        return set(super().get_save_ops()) | {OP}


class FP4FullAC(FullAC):
    """Full AC that recomputes everything but fp4quant's forward collectives (their results kept)."""

    @dataclass(kw_only=True, slots=True)
    class Config(FullAC.Config):
        pass

    def _wrap_block(self, module, *, base_fqn=None):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        return checkpoint_wrapper(module, context_fn=lambda: create_selective_checkpoint_contexts(
            _save_fp4quant_collectives), preserve_rng_state=self.config.preserve_rng_state,
            determinism_check=self.config.determinism_check, early_stop=False, debug=self.config.debug)


@override(target=SelectiveAC.Config, exact=True,
          description="fp4quant: selective AC keeps the compressed forward collectives' results")
def selective_ac(cfg):
    return derive(cfg, FP4SelectiveAC.Config)


@override(target=FullAC.Config, exact=True,
          description="fp4quant: full AC keeps the compressed forward collectives' results")
def full_ac(cfg):
    return derive(cfg, FP4FullAC.Config)


OVERRIDES = tuple(f"{__name__}.{f.__name__}" for f in (attention, feed_forward, embedding, output_norm))
"""The model overrides, for ``override.imports`` (add ``selective_ac`` or ``full_ac`` per the AC)."""
