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

import torch
from torchtitan.config import derive, override
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.common.attention import GQAttention
from torchtitan.models.common.embedding import Embedding
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.nn_modules import RMSNorm
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import SpmdLayout, resolve_placements

from ..parallel.communicator import CommConfig
from ..parallel.styles import MODULE_ATTRIBUTE, communicator, start_step
from .torchtitan_boundary import (OP, UnsupportedConfig, _Boundary, _boundaries, _handle, exact_fallbacks,
                                  has_tp_boundary)

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
