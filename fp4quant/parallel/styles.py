"""Compressed tensor parallelism as PyTorch parallel styles: a drop-in for ``parallelize_module``.

    from torch.distributed.tensor.parallel import parallelize_module
    from fp4quant.parallel.styles import CompressedColwiseParallel, CompressedRowwiseParallel, start_step
    parallelize_module(model, tp_mesh, {"w1": CompressedColwiseParallel(), "w2": CompressedRowwiseParallel()})
    # several column-parallel layers on one input (q, k, v; gate, up): prepare it once, at the block
    parallelize_module(model, tp_mesh, {"attn": CompressedPrepareModuleInput(input_layouts=Replicate(),
                                                                             desired_input_layouts=Replicate()),
                                        "attn.q": CompressedColwiseParallel(), ...})
    for step in ...:
        start_step(model, step)          # key the stochastic-rounding streams by the step
        loss = model(x).sum(); loss.backward(); optimizer.step()

The styles take the stock styles' arguments plus ``comm`` (a CommConfig or a preset name,
default ``DEFAULT_COMM``).  Parameters are partitioned by the stock styles' own functions,
so weights stay DTensors (optimizers, ``state_dict``, DCP work as usual).  The module then
computes on the local shards, between the conjugate autograd mappings of
fp4quant.parallel.mappings on local tensors: DTensor's ``Partial -> Replicate`` covers only
the forward, and the backward's input-gradient reduction must be compressed too.

  colwise  forward: identity (Replicate input) or all-gather of the sequence (Shard input);
           backward: all-reduce ("bwd") or reduce-scatter ("bwd") of the input gradient.
           A Replicate DTensor input is taken as prepared: its gradient goes back partial,
           to be reduced once by the DTensor's producer (as the stock ColwiseParallel does)
  input    CompressedPrepareModuleInput: the block-level input of a module whose column-parallel
           layers share one input (attention: q, k, v; a gated MLP: gate, up).  Each chosen
           input becomes a Replicate DTensor (forward: identity, or all-gather of a Shard
           input, "fwd") that owns one reduction of its consumers' summed partial gradients
           (all-reduce or reduce-scatter, "bwd"): one backward collective per block, not one
           per projection (Megatron's and torchtitan's traffic)
  rowwise  forward: all-reduce ("fwd") to Replicate or reduce-scatter ("fwd") to Shard;
           backward: identity or all-gather ("bwd"); the bias is added after the reduction
  sequence its input, when a Partial DTensor, is reduce-scattered ("fwd"; all-gather "bwd");
           otherwise it is the stock SequenceParallel (it sends nothing itself)

What stays exact (stock DTensor): a colwise output gathered to Replicate (lm_head's logits:
no backward traffic), the reductions of replicated parameters' gradients, and the backward
reduction of a Replicate DTensor made by something else (a stock PrepareModuleInput, a
user's ``DTensor.from_local``): its producer reduces, as it would for the stock styles.

Who reduces the gradient of a replicated input, in one rule: a plain tensor declared
Replicate is reduced by the column-parallel layer that consumes it; a Replicate DTensor by
whoever made it.  A Replicate DTensor made by these styles (CompressedPrepareModuleInput, a
rowwise output with ``use_local_output=False``) takes a partial gradient (summed over its
consumers, then reduced once, compressed) or a full one (nothing sent).

Every style applied with one mesh and one CommConfig goes through one TPCommunicator,
kept on the mesh object (``communicator``); it owns the random streams of stochastic
rounding.  ``start_step(model, step)`` keys the streams of every communicator a model
uses by the step, so a rerun or a resumed run replays them, and every rank of a TP group
(which calls its collectives in the same order) draws the same seeds.  Without it the
streams are keyed by a call counter that never restarts: still reproducible from the
start of the process, not across a resume.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from .communicator import CommConfig, TPCommunicator
from .layers import vocab_shard_lookup
from .mappings import copy_to_tp, gather_from_sp, reduce_from_tp, scatter_to_sp

DEFAULT_COMM = "fp4quant"  # the trainer's --comm fp4quant: both directions, stochastic rounding backward
MESH_ATTRIBUTE = "_fp4quant_communicators"  # {CommConfig: TPCommunicator} on a DeviceMesh
MODULE_ATTRIBUTE = "fp4quant_tp"  # the TPCommunicator of a module parallelized by these styles


def comm_config(comm: CommConfig | str | None) -> CommConfig:
    """A CommConfig from a CommConfig, a preset name ("exact" included) or None (the default)."""
    if comm is None:
        comm = DEFAULT_COMM
    if isinstance(comm, CommConfig):
        return comm
    if isinstance(comm, str):
        return CommConfig.from_preset(comm)
    raise TypeError(f"comm must be a CommConfig or a preset name, got {type(comm).__name__}")


def check_mesh(mesh: DeviceMesh) -> None:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"the TP mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"tensor parallelism needs a 1-D mesh, got a {mesh.ndim}-D mesh {tuple(mesh.shape)} "
                         f"(pass the TP dimension, e.g. mesh['tp'])")


def communicator(mesh: DeviceMesh, config: CommConfig) -> TPCommunicator:
    """The one TPCommunicator of ``mesh`` under ``config``: made on first use, kept on the mesh."""
    check_mesh(mesh)
    table = mesh.__dict__.setdefault(MESH_ATTRIBUTE, {})
    if config not in table:
        table[config] = TPCommunicator(mesh.get_group(), config)
    return table[config]


def communicators(model: nn.Module) -> list[TPCommunicator]:
    """The distinct TPCommunicators the compressed modules of ``model`` use (first-use order)."""
    found: dict[int, TPCommunicator] = {}
    for module in model.modules():
        tp = getattr(module, MODULE_ATTRIBUTE, None)
        if tp is not None:
            found.setdefault(id(tp), tp)
    return list(found.values())


def start_step(model: nn.Module, step: int, validate: bool = False) -> None:
    """Key the random streams of every communicator ``model`` uses by ``step`` (call it on every
    rank before each step's forward); ``validate``: check this step's collectives across ranks."""
    for tp in communicators(model):
        tp.start_step(step, validate=validate)


# ---- local tensors in and out ---------------------------------------------------------------


def _local(p: torch.Tensor | None, grad_placement=None) -> torch.Tensor | None:
    if isinstance(p, DTensor):
        return p.to_local(grad_placements=None if grad_placement is None else (grad_placement,))
    return p


def _unwrap(x, layout, what: str):
    """(local tensor, its placement): a DTensor's own, else the style's declared layout."""
    if isinstance(x, DTensor):
        if x.device_mesh.ndim != 1:
            raise ValueError(f"{what}: the input DTensor lives on a {x.device_mesh.ndim}-D mesh; TP needs 1-D")
        return x.to_local(), x.placements[0]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: the input must be a torch.Tensor or DTensor, got {type(x).__name__}")
    return x, layout


def _dim(layout: Shard, ndim: int) -> int:
    return layout.dim % ndim


def _gather(x: torch.Tensor, dim: int, tp: TPCommunicator) -> torch.Tensor:
    """Compressed all-gather along ``dim`` (reduce-scatter backward)."""
    return gather_from_sp(x.movedim(dim, 0).contiguous(), tp).movedim(0, dim)


def _scatter(x: torch.Tensor, dim: int, tp: TPCommunicator) -> torch.Tensor:
    """Compressed reduce-scatter along ``dim`` (all-gather backward)."""
    return scatter_to_sp(x.movedim(dim, 0).contiguous(), tp).movedim(0, dim)


def _partial_sum(placement) -> bool:
    return isinstance(placement, Partial) and getattr(placement, "reduce_op", "sum") == "sum"


class _Replicated(torch.autograd.Function):
    """A local tensor -> the full tensor as a Replicate DTensor that owns its gradient's reduction.

    layout Replicate: forward identity; Shard(dim): compressed all-gather along dim ("fwd").
    Backward, by the gradient's placement: Partial (the column-parallel consumers' partial
    input gradients, summed by autograd) -> one compressed all-reduce / reduce-scatter
    ("bwd"); Replicate (a full gradient: DTensor ops) -> nothing sent (this rank's slice for a
    Shard layout); another placement -> DTensor's own redistribution to Replicate first.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, tp: TPCommunicator, mesh: DeviceMesh, layout):
        ctx.tp, ctx.layout = tp, layout
        ctx.set_materialize_grads(False)
        if isinstance(layout, Shard):
            full = tp.all_gather(local.movedim(layout.dim, 0).contiguous(), "fwd").movedim(0, layout.dim)
        else:
            full = local.view_as(local)  # a fresh tensor object sharing local's memory, as from_local makes
        return DTensor.from_local(full, mesh, (Replicate(),), run_check=False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None, None
        tp, layout = ctx.tp, ctx.layout
        partial = isinstance(grad, DTensor) and _partial_sum(grad.placements[0])
        if isinstance(grad, DTensor):
            grad = grad.to_local() if partial or grad.placements[0].is_replicate() else grad.full_tensor()
        if isinstance(layout, Shard):
            moved = grad.movedim(layout.dim, 0)
            if partial:
                local = tp.reduce_scatter(moved.contiguous(), "bwd")
            else:
                n = moved.shape[0] // tp.world
                local = moved[tp.rank * n:(tp.rank + 1) * n]
            return local.movedim(0, layout.dim), None, None, None
        if partial:  # a copy: autograd may hand the same gradient buffer to other consumers
            grad = tp.all_reduce(grad.clone(memory_format=torch.contiguous_format), "bwd")
        return grad, None, None, None


@torch.compiler.disable  # the collectives run eagerly, in call order: the streams stay the eager run's
def _prepared(x, layout, tp: TPCommunicator, mesh: DeviceMesh, what: str) -> DTensor:
    """A module input as a Replicate DTensor that owns the reduction of its gradient (_Replicated);
    a Replicate DTensor already is prepared (its producer reduces), and is passed as it is."""
    if isinstance(x, DTensor) and x.device_mesh.ndim == 1 and x.placements[0].is_replicate():
        return x
    local, layout = _unwrap(x, layout, what)
    if isinstance(layout, Shard):
        layout = Shard(_dim(layout, local.dim()))
    elif not isinstance(layout, Replicate):
        raise ValueError(f"{what}: input placement {layout} is not supported (Replicate or Shard)")
    return _Replicated.apply(local, tp, mesh, layout)


@torch.compiler.disable  # the collectives run eagerly, in call order: the streams stay the eager run's
def _replicated_input(x, layout, tp: TPCommunicator, what: str) -> torch.Tensor:
    """The full input of a column-parallel layer.  Its gradient is reduced (compressed) backward
    here for a plain tensor or a Shard DTensor; a Replicate DTensor is a prepared input (a
    block-level input style made it): its producer reduces the gradient, once for all its consumers."""
    if isinstance(x, DTensor) and x.device_mesh.ndim == 1 and x.placements[0].is_replicate():
        return x.to_local(grad_placements=(Partial(),))  # prepared: the partial gradient goes back
    local, layout = _unwrap(x, layout, what)
    if isinstance(layout, Replicate):
        return copy_to_tp(local, tp)
    if isinstance(layout, Shard):
        return _gather(local, _dim(layout, local.dim()), tp)
    raise ValueError(f"{what}: input placement {layout} is not supported (Replicate or Shard)")


@torch.compiler.disable  # the collectives run eagerly, in call order: the streams stay the eager run's
def _reduced_output(y: torch.Tensor, layout, tp: TPCommunicator, what: str) -> torch.Tensor:
    """The sum over TP of partial outputs: all-reduce to Replicate or reduce-scatter to Shard."""
    if isinstance(layout, Replicate):
        return reduce_from_tp(y, tp)
    if isinstance(layout, Shard):
        return _scatter(y, _dim(layout, y.dim()), tp)
    raise ValueError(f"{what}: output placement {layout} is not supported (Replicate or Shard)")


def _wrap(y: torch.Tensor, layout, mesh: DeviceMesh, use_local_output: bool, tp: TPCommunicator | None = None):
    if use_local_output:
        return y
    if tp is not None and isinstance(layout, Replicate):  # a reduced output, which reduces a partial gradient
        return _prepared(y, Replicate(), tp, mesh, "the output")
    return DTensor.from_local(y, mesh, (layout,), run_check=False)


def _check_divides(n: int, tp: int, what: str, unit: tuple[int, str] | None) -> None:
    if unit is not None:
        size, name = unit
        if n % size or (n // size) % tp:
            raise ValueError(f"{what}: the TP size {tp} does not divide the {n // size} {name} ({n} / {size})")
    if n % tp:
        raise ValueError(f"{what}: {n} is not divisible by the TP size {tp}")


def _supported(module: nn.Module, style: str) -> str:
    """'linear' or 'embedding'; anything else (including subclasses with their own forward) is refused."""
    for kind, cls in (("linear", nn.Linear), ("embedding", nn.Embedding)):
        if isinstance(module, cls) and type(module).forward is cls.forward:
            return kind
    raise NotImplementedError(f"{style} supports nn.Linear and nn.Embedding (with their own forward), "
                              f"got {type(module).__name__}")


def _embedding(module: nn.Embedding, ids: torch.Tensor, weight: torch.Tensor, padding_idx) -> torch.Tensor:
    return F.embedding(ids, weight, padding_idx, module.max_norm, module.norm_type, module.scale_grad_by_freq,
                       module.sparse)


# ---- forwards on local shards ---------------------------------------------------------------


def _colwise_forward(module: nn.Module, style: CompressedColwiseParallel, kind: str, tp: TPCommunicator,
                     mesh: DeviceMesh, x, *args, **kwargs):
    what = f"{type(style).__name__} on {type(module).__name__}"
    if kind == "linear":
        y = F.linear(_replicated_input(x, style.input_layouts[0], tp, what), _local(module.weight), _local(module.bias))
    else:  # ids carry no gradient and every rank holds them: nothing to send either way
        ids, _ = _unwrap(x, style.input_layouts[0], what)
        y = _embedding(module, ids, _local(module.weight), module.padding_idx)
    layout = style.output_layouts[0]
    if isinstance(layout, Shard) and _dim(layout, y.dim()) == y.dim() - 1:
        return _wrap(y, Shard(-1), mesh, style.use_local_output)
    # another output layout (lm_head's gathered logits): DTensor's redistribution, exact
    out = DTensor.from_local(y, mesh, (Shard(-1),), run_check=False).redistribute(placements=(layout,))
    return out.to_local() if style.use_local_output else out


def _rowwise_forward(module: nn.Module, style: CompressedRowwiseParallel, kind: str, tp: TPCommunicator,
                     mesh: DeviceMesh, x, *args, **kwargs):
    what = f"{type(style).__name__} on {type(module).__name__}"
    local, layout = _unwrap(x, style.input_layouts[0], what)
    if kind == "linear":
        if not (isinstance(layout, Shard) and _dim(layout, local.dim()) == local.dim() - 1):
            raise ValueError(f"{what}: the input must be sharded on its last dimension (Shard(-1)), got {layout}")
        y = F.linear(local, _local(module.weight))
    else:
        if not isinstance(layout, Replicate):
            raise ValueError(f"{what}: the token ids must be replicated, got {layout}")
        weight = _local(module.weight)
        start = tp.rank * weight.shape[0]
        pad = module.padding_idx
        pad = pad - start if pad is not None and start <= pad < start + weight.shape[0] else None
        y = vocab_shard_lookup(local, weight, start, partial(_embedding, module, padding_idx=pad))
    out_layout = style.output_layouts[0]
    y = _reduced_output(y, out_layout, tp, what)
    bias = getattr(module, "bias", None) if kind == "linear" else None
    if bias is not None:  # once, after the reduction; with a sharded output each rank's gradient is partial
        y = y + _local(bias, Partial() if isinstance(out_layout, Shard) else None)
    return _wrap(y, out_layout, mesh, style.use_local_output, tp)


@torch.compiler.disable  # the collectives run eagerly, in call order: the streams stay the eager run's
def _sequence_input(style: CompressedSequenceParallel, tp: TPCommunicator, mod, inputs, mesh):
    x = inputs[0]
    if isinstance(x, DTensor) and isinstance(x.placements[0], Partial):
        # the gradient of a partial sum is the full gradient on every rank
        local = x.to_local(grad_placements=(Replicate(),))
        y = _scatter(local, _dim(style.sequence_sharding[0], local.dim()), tp)
        return DTensor.from_local(y, mesh, style.sequence_sharding, run_check=False)
    return SequenceParallel._prepare_input_fn(style.sequence_sharding, mod, inputs, mesh)


# ---- the styles ---------------------------------------------------------------------------------


class _Compressed:
    """What the three styles share: the comm config, its communicator, the checks."""

    unit: tuple[int, str] | None = None  # shard in whole units (head_dim, "attention heads"): see in_units_of

    def _init_comm(self, comm) -> None:
        self.comm = comm_config(comm)

    def in_units_of(self, size: int, name: str):
        """Refuse a TP size that would split a unit of ``size`` values (an attention head) across ranks."""
        self.unit = (size, name)
        return self

    def _communicator(self, module: nn.Module, mesh: DeviceMesh) -> TPCommunicator:
        tp = communicator(mesh, self.comm)
        setattr(module, MODULE_ATTRIBUTE, tp)
        return tp

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, comm={self.comm})"


class _Sharded(_Compressed):
    """Colwise / rowwise: the stock partition of nn.Linear / nn.Embedding, then the local forward."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True,
                 comm: CommConfig | str | None = None):
        super().__init__(input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output)
        self._init_comm(comm)

    def _kind(self, module: nn.Module, mesh: DeviceMesh) -> str:
        kind = _supported(module, type(self).__name__)
        check_mesh(mesh)
        _check_divides(self._sharded_size(module, kind), mesh.size(), f"{type(self).__name__} on {module}", self.unit)
        return kind

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        kind = self._kind(module, device_mesh)
        distribute_module(module, device_mesh,
                          self._partition_linear_fn if kind == "linear" else self._partition_embedding_fn)
        return self._apply_forward(module, device_mesh)

    def _apply_forward(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        """Install the compressed forward on a module whose parameters are partitioned already
        (by _apply, or by transformers' loader: fp4quant.parallel.hf_plan)."""
        kind = self._kind(module, device_mesh)
        tp = self._communicator(module, device_mesh)
        module.forward = partial(self._forward, module, self, kind, tp, device_mesh)
        return module


class CompressedColwiseParallel(_Sharded, ColwiseParallel):
    """ColwiseParallel whose input-gradient all-reduce (or, with a sequence-sharded input, the
    all-gather forward and reduce-scatter backward) goes through fp4quant's communicator."""

    _forward = staticmethod(_colwise_forward)

    @staticmethod
    def _sharded_size(module: nn.Module, kind: str) -> int:
        return module.out_features if kind == "linear" else module.embedding_dim


class CompressedRowwiseParallel(_Sharded, RowwiseParallel):
    """RowwiseParallel whose forward all-reduce (reduce-scatter to a Shard output, with its
    all-gather backward) goes through fp4quant's communicator."""

    _forward = staticmethod(_rowwise_forward)

    @staticmethod
    def _sharded_size(module: nn.Module, kind: str) -> int:
        return module.in_features if kind == "linear" else module.num_embeddings


class CompressedSequenceParallel(_Compressed, SequenceParallel):
    """SequenceParallel that reduce-scatters a Partial DTensor input through fp4quant's
    communicator; the sequence-parallel traffic proper is at the colwise / rowwise boundaries."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False, comm: CommConfig | str | None = None):
        super().__init__(sequence_dim=sequence_dim, use_local_output=use_local_output)
        self._init_comm(comm)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        check_mesh(device_mesh)
        tp = self._communicator(module, device_mesh)
        return distribute_module(module, device_mesh, self._replicate_module_fn,
                                 partial(_sequence_input, self, tp),
                                 partial(SequenceParallel._prepare_output_fn, self.use_local_output))


def _prepare_inputs(style: CompressedPrepareModuleInput, tp: TPCommunicator, mesh: DeviceMesh, module: nn.Module,
                    args: tuple, kwargs: dict):
    what = f"{type(style).__name__} on {type(module).__name__}"
    if style.input_layouts is not None:
        if len(args) != len(style.input_layouts):
            raise ValueError(f"{what}: the module got {len(args)} positional inputs, input_layouts has "
                             f"{len(style.input_layouts)} (None for an input to leave as it is)")
        args = tuple(style._prepare(x, layout, tp, mesh, what) for x, layout in zip(args, style.input_layouts))
    for name, layout in style.input_kwarg_layouts.items():
        if name in kwargs:
            kwargs[name] = style._prepare(kwargs[name], layout, tp, mesh, f"{what}, input {name!r}")
    return args, kwargs


class CompressedPrepareModuleInput(_Compressed, PrepareModuleInput):
    """PrepareModuleInput that makes a block's input replicated with ONE compressed backward
    reduction, for the column-parallel layers inside the block that all consume it (attention's
    q, k, v; a gated MLP's gate and up), as Megatron's and torchtitan's block-level input does.

    The stock arguments (``input_layouts`` / ``desired_input_layouts`` by position,
    ``input_kwarg_layouts`` / ``desired_input_kwarg_layouts`` by name, None for an input left
    as it is, ``use_local_output``), plus ``comm``.  The desired layout is Replicate; the input
    layout Replicate (the block's input is already whole on every rank: forward sends nothing,
    backward all-reduces the summed partial gradients) or Shard(dim) (sequence parallel: a
    compressed all-gather forward, a reduce-scatter backward).  A DTensor input brings its own
    placement; one already Replicate is passed as it is (its producer reduces its gradient).

    The prepared input is a Replicate DTensor (``use_local_output=False``, the default, as the
    stock style's): the column-parallel layers inside take it without a reduction of their
    own and send their partial input gradients back to it.  With ``use_local_output=True`` the
    module gets a plain tensor whose gradient must come back whole (the consumers then reduce
    it themselves: this saves nothing; it is the stock style's meaning of the flag).
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False,
                 comm: CommConfig | str | None = None):
        if isinstance(input_layouts, Placement):
            input_layouts = (input_layouts,)
        # the desired layouts may be left out: the one this style makes is Replicate
        if input_layouts is not None and desired_input_layouts is None:
            desired_input_layouts = tuple(None if p is None else Replicate() for p in input_layouts)
        if input_kwarg_layouts is not None and desired_input_kwarg_layouts is None:
            desired_input_kwarg_layouts = {k: None if p is None else Replicate()
                                           for k, p in input_kwarg_layouts.items()}
        super().__init__(input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
                         input_kwarg_layouts=input_kwarg_layouts,
                         desired_input_kwarg_layouts=desired_input_kwarg_layouts, use_local_output=use_local_output)
        self._init_comm(comm)
        pairs = list(zip(self.input_layouts or (), self.desired_input_layouts or ()))
        pairs += [(p, self.desired_input_kwarg_layouts.get(k)) for k, p in self.input_kwarg_layouts.items()]
        for layout, desired in pairs:
            if layout is None:
                continue
            if not isinstance(layout, (Replicate, Shard)):
                raise ValueError(f"{type(self).__name__}: input placement {layout} is not supported "
                                 f"(Replicate or Shard)")
            if not isinstance(desired, Replicate):
                raise ValueError(f"{type(self).__name__}: the desired input layout must be Replicate (the input of "
                                 f"column-parallel layers), got {desired}")

    def _prepare(self, x, layout, tp: TPCommunicator, mesh: DeviceMesh, what: str):
        """One input: left as it is (layout None), else prepared (the desired layout is Replicate)."""
        if layout is None or x is None:
            return x
        out = _prepared(x, layout, tp, mesh, what)
        return out.to_local() if self.use_local_output else out

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        check_mesh(device_mesh)
        tp = self._communicator(module, device_mesh)
        module.register_forward_pre_hook(partial(_prepare_inputs, self, tp, device_mesh), with_kwargs=True)
        return module
