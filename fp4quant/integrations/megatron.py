"""Megatron-Core: the TP traffic of its parallel layers through one fp4quant TPCommunicator.

    from megatron.core import parallel_state
    from fp4quant.integrations import megatron as fp4_megatron

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    fp4_megatron.enable("fp4quant")           # a preset, "exact", a CommConfig or a TPCommunicator
    model = GPTModel(config, get_gpt_layer_local_spec(), ...)
    fp4_megatron.check(model)                 # refuses Transformer Engine layers, in one line
    for step in ...:
        fp4_megatron.start_step(step)         # keys the stochastic-rounding streams
        ...
    fp4_megatron.disable()                    # Megatron exactly as it was

Through fp4quant: every collective of Megatron-Core's ``ColumnParallelLinear``,
``RowParallelLinear`` and ``VocabParallelEmbedding`` on the tensor-model-parallel group:

- "fwd": the all-reduce after a row-parallel layer or the embedding; with sequence parallelism
  the all-gather before a column-parallel layer and the reduce-scatter after a row-parallel
  layer or the embedding;
- "bwd": a column-parallel layer's input-gradient all-reduce; with sequence parallelism the
  reduce-scatter and all-gather conjugate to the forward ones.

Stays stock: the weight gradient (gradient-accumulation fusion, ``main_grad``), MoE token
dispatch, the vocab-parallel cross entropy's small reductions, data-parallel reductions,
pipeline transfers.  How: ``enable`` rebinds, in ``megatron.core.tensor_parallel.layers``
only, the six mappings it imports (``MAPPING_NAMES``) to the communicator's conjugate
functions and the two linear functions (``LINEAR_NAMES``) to wrappers that map the input
first and turn off Megatron's own collectives; ``disable`` puts the same objects back.  Why
that is every TP collective, and where the result differs from stock Megatron (with sequence
parallelism: one all-gather fewer backward, more activation memory):
docs/results/integrations.md.

Refused, in one line each: Transformer Engine layers (``check`` / ``enable(..., model=)``:
they communicate inside TE); a layer on a TP group other than enable's; an uneven
sequence-parallel split.  Warned: a step that sent no TP traffic (``start_step``); learned
absolute positions with sequence parallelism (that split's backward all-gather stays exact).

Tested with Megatron-Core 0.16.1 (the newest for Python 3.11), torch 2.13, CPU / gloo, TP = 2;
``enable`` warns on another version and refuses one lacking what the rebinding relies on.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from ..parallel.communicator import CommConfig, TPCommunicator
from ..parallel.mappings import copy_to_tp, gather_from_sp, reduce_from_tp, scatter_to_sp

TESTED_VERSIONS = ("0.16.1",)
LAYERS_MODULE = "megatron.core.tensor_parallel.layers"
MAPPING_NAMES = (
    "copy_to_tensor_model_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "gather_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region",
)
LINEAR_NAMES = ("linear_with_grad_accumulation_and_async_allreduce", "linear_with_frozen_weight")
LINEAR_ARGS = ("input", "allreduce_dgrad", "sequence_parallel", "tp_group")
REBOUND = MAPPING_NAMES + LINEAR_NAMES
# where Transformer Engine's classes live: TE itself, and Megatron's wrappers of them
TE_MODULES = ("transformer_engine", "megatron.core.extensions.transformer_engine")


class UnsupportedLayers(RuntimeError):
    """The model holds layers whose TP traffic fp4quant cannot carry (Transformer Engine's)."""


@dataclass
class _State:
    comm: TPCommunicator
    layers: Any  # the megatron.core.tensor_parallel.layers module
    originals: dict[str, Callable]
    routed: int = 0  # layer calls that went through the communicator since the last start_step
    steps: int = 0
    warned: set = field(default_factory=set)


_STATE: _State | None = None


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"fp4quant.integrations.megatron needs megatron-core ({e}); "
                          "pip install 'fp4quant[megatron]'") from e


def megatron_version() -> str:
    return _import("megatron.core.package_info").__version__


# ---------------------------------------------------------------------------------------------
# enable / disable / start_step


def enable(comm: str | CommConfig | TPCommunicator = "fp4quant", *, model=None, group=None,
           compress: str = "both") -> TPCommunicator:
    """Send the TP traffic of Megatron-Core's parallel layers through one TPCommunicator.

    ``comm``: a preset name ("fp4quant", "nvfp4", "bf16", ...; applied to the directions
    ``compress`` names as CommConfig.from_preset does), "exact" (every tensor in its own dtype:
    bit for bit stock Megatron), a CommConfig, or a TPCommunicator of the TP group.  Call after
    ``parallel_state.initialize_model_parallel``; ``group`` defaults to its tensor-model-parallel
    group.  Before or after the model is built: the layers look the rebound names up at each call.
    ``model`` (a module or a list of model chunks): checked with ``check`` first.  Enabling again
    replaces the communicator.  Returns the communicator."""
    global _STATE
    if model is not None:
        check(model)
    layers = _import(LAYERS_MODULE)
    mappings = _import("megatron.core.tensor_parallel.mappings")
    if _STATE is not None:
        disable()
    _check_structure(layers, mappings)
    version = megatron_version()
    if version not in TESTED_VERSIONS:
        warnings.warn(f"fp4quant.integrations.megatron is tested with Megatron-Core {', '.join(TESTED_VERSIONS)}; "
                      f"found {version}", stacklevel=2)
    if isinstance(comm, TPCommunicator):
        tp = comm
        if group is not None and tp.group is not group:
            raise ValueError("the TPCommunicator's group is not the group given")
    else:
        if group is None:
            parallel_state = _import("megatron.core.parallel_state")
            if not parallel_state.model_parallel_is_initialized():
                raise RuntimeError("fp4quant.integrations.megatron.enable: call it after "
                                   "parallel_state.initialize_model_parallel (or pass group=)")
            group = parallel_state.get_tensor_model_parallel_group()
        config = comm if isinstance(comm, CommConfig) else CommConfig.from_preset(comm, compress)
        tp = TPCommunicator(group, config)
    originals = {name: getattr(layers, name) for name in REBOUND}
    _STATE = _State(tp, layers, originals)
    replacements = {**_MAPPINGS, **{name: _linear(originals[name]) for name in LINEAR_NAMES}}
    for name in REBOUND:
        setattr(layers, name, replacements[name])
    return tp


def disable() -> None:
    """Put Megatron's own functions back (the very objects enable found); a no-op when not enabled."""
    global _STATE
    if _STATE is None:
        return
    for name, original in _STATE.originals.items():
        setattr(_STATE.layers, name, original)
    _STATE = None


def enabled() -> bool:
    return _STATE is not None


def communicator() -> TPCommunicator | None:
    """The TPCommunicator the layers send through (None when not enabled)."""
    return _STATE.comm if _STATE is not None else None


def start_step(step: int, validate: bool = False) -> None:
    """Key the communicator's random streams by ``step`` (a resumed run replays them);
    ``validate``: check this step's collectives across ranks.  Warns once when the step before
    sent no TP traffic through fp4quant although TP > 1 (e.g. Transformer Engine layers)."""
    if _STATE is None:
        raise RuntimeError("fp4quant.integrations.megatron is not enabled (call enable() first)")
    s = _STATE
    if s.steps and not s.routed and s.comm.world > 1 and "idle" not in s.warned:
        s.warned.add("idle")
        warnings.warn("fp4quant.integrations.megatron: the last step sent no TP traffic through fp4quant; "
                      "are the model's layers Transformer Engine's? (check(model) names them)", stacklevel=2)
    s.comm.start_step(step, validate=validate)
    s.routed, s.steps = 0, s.steps + 1


# ---------------------------------------------------------------------------------------------
# check


def _te_class(cls: type) -> type | None:
    """The first class in ``cls``'s MRO that Transformer Engine (or Megatron's TE extension) defines."""
    for c in cls.__mro__:
        module = getattr(c, "__module__", "") or ""
        if any(module == m or module.startswith(m + ".") for m in TE_MODULES):
            return c
    return None


def _modules(model) -> Iterable[tuple[str, torch.nn.Module]]:
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    for i, chunk in enumerate(chunks):
        for name, module in chunk.named_modules():
            prefix = f"[{i}]." if len(chunks) > 1 else ""
            yield prefix + (name or "<model>"), module


def check(model) -> None:
    """Refuse, in one line naming them, the Transformer Engine layers of ``model`` (a module or a
    list of model chunks): they communicate inside TE, where fp4quant cannot compress.  Warns
    when the embedding splits the sequence itself (sequence parallelism with learned absolute
    positions: that backward all-gather stays exact)."""
    found: dict[str, list[str]] = {}
    for name, module in _modules(model):
        te = _te_class(type(module))
        if te is not None:
            found.setdefault(type(module).__name__, []).append(name)
        elif (type(module).__name__ == "LanguageModelEmbedding" and getattr(getattr(module, "config", None),
              "sequence_parallel", False) and not getattr(module, "reduce_scatter_embeddings", True)
              and getattr(module, "scatter_to_sequence_parallel", True)):
            warnings.warn(f"fp4quant.integrations.megatron: {name} splits the sequence itself (sequence parallelism "
                          "with learned absolute positions); the backward all-gather of that split stays exact "
                          "(RoPE embeddings reduce-scatter inside VocabParallelEmbedding, which is compressed)",
                          stacklevel=2)
    if found:
        listed = "; ".join(f"{cls} ({', '.join(names[:2])}{f', +{len(names) - 2} more' if len(names) > 2 else ''})"
                           for cls, names in found.items())
        raise UnsupportedLayers(f"fp4quant.integrations.megatron: Transformer Engine layers communicate inside TE, "
                                f"where fp4quant cannot compress: {listed}; build the model with the local spec "
                                "(get_gpt_layer_local_spec) instead")


def _check_structure(layers, mappings) -> None:
    """What the rebinding relies on, checked on the installed Megatron-Core: the eight names are
    globals of layers.py (looked up at each call), the mappings are those of mappings.py, and the
    linear functions take ``LINEAR_ARGS``."""
    problems = []
    for name in MAPPING_NAMES:
        if getattr(layers, name, None) is not getattr(mappings, name, object()):
            problems.append(f"layers.{name} is not mappings.{name}")
    for name in LINEAR_NAMES:
        fn = getattr(layers, name, None)
        if fn is None:
            problems.append(f"layers.{name} is missing")
        elif getattr(fn, "__fp4quant__", False):
            problems.append(f"layers.{name} is already rebound")
        else:
            params = inspect.signature(fn).parameters
            missing = [a for a in LINEAR_ARGS if a not in params]
            if missing:
                problems.append(f"layers.{name} takes no {missing}")
    if problems:
        raise RuntimeError(f"fp4quant.integrations.megatron cannot rebind Megatron-Core {megatron_version()} "
                           f"(tested with {', '.join(TESTED_VERSIONS)}): {'; '.join(problems)}")


# ---------------------------------------------------------------------------------------------
# the adapter: Megatron's mapping signatures on the communicator


def _comm(group) -> TPCommunicator | None:
    """The communicator for a layer's ``group``; None where nothing is sent (a group of one)."""
    s = _STATE
    if s is None:  # a layer holding a wrapper across disable(): cannot happen through the module
        raise RuntimeError("fp4quant.integrations.megatron is disabled")
    if group is None:
        group = s.comm.group
    if group is not s.comm.group:
        if dist.get_world_size(group) == 1:
            return None
        raise RuntimeError("fp4quant.integrations.megatron: a parallel layer communicates on a group other than "
                           "the tensor-model-parallel group enable() was given (pass that group to enable)")
    if s.comm.world == 1:
        return None
    s.routed += 1
    return s.comm


def _stock(name: str):
    return _STATE.originals[name]


def _unsupported(what: str):
    raise RuntimeError(f"fp4quant.integrations.megatron: {what} is not supported (not used by Megatron-Core's "
                       f"parallel layers in {', '.join(TESTED_VERSIONS)})")


def _fresh(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy where reducing it in place would break autograd (a view, a leaf that
    requires grad); the values are the same."""
    if x._base is not None or (x.is_leaf and x.requires_grad and torch.is_grad_enabled()):
        return x.clone()
    return x


def copy_to_tensor_model_parallel_region(input_, group=None):
    tp = _comm(group)
    return copy_to_tp(input_, tp) if tp is not None else _stock("copy_to_tensor_model_parallel_region")(input_, group)


def reduce_from_tensor_model_parallel_region(input_, group=None):
    tp = _comm(group)
    if tp is None:
        return _stock("reduce_from_tensor_model_parallel_region")(input_, group)
    return reduce_from_tp(_fresh(input_), tp)


def gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=True, group=None,
                                         output_split_sizes=None, use_global_buffer=False):
    # use_global_buffer only saves an allocation: the result here is always a fresh tensor
    tp = _comm(group)
    if tp is None:
        return _stock("gather_from_sequence_parallel_region")(input_, tensor_parallel_output_grad, group,
                                                             output_split_sizes, use_global_buffer)
    if output_split_sizes is not None:
        _unsupported("an uneven sequence-parallel all-gather (output_split_sizes)")
    if tensor_parallel_output_grad:
        return gather_from_sp(input_, tp)
    return _GatherThenSplit.apply(input_, tp)


def reduce_scatter_to_sequence_parallel_region(input_, group=None, input_split_sizes=None, use_global_buffer=False):
    tp = _comm(group)
    if tp is None:
        return _stock("reduce_scatter_to_sequence_parallel_region")(input_, group, input_split_sizes,
                                                                   use_global_buffer)
    if input_split_sizes is not None:
        _unsupported("an uneven sequence-parallel reduce-scatter (input_split_sizes)")
    return scatter_to_sp(input_, tp)


def gather_from_tensor_model_parallel_region(input_, group=None):
    tp = _comm(group)
    if tp is None:
        return _stock("gather_from_tensor_model_parallel_region")(input_, group)
    return _GatherLastDim.apply(input_, tp)


def scatter_to_tensor_model_parallel_region(input_, group=None):
    tp = _comm(group)
    if tp is None:
        return _stock("scatter_to_tensor_model_parallel_region")(input_, group)
    return _SplitLastDim.apply(input_, tp)


_MAPPINGS = {name: globals()[name] for name in MAPPING_NAMES}


def _gather_last(x: torch.Tensor, tp: TPCommunicator, direction: str) -> torch.Tensor:
    return torch.cat(tp.all_gather(x.contiguous(), direction).chunk(tp.world, dim=0), dim=-1).contiguous()


def _split(x: torch.Tensor, tp: TPCommunicator, dim: int) -> torch.Tensor:
    if x.shape[dim] % tp.world:
        raise ValueError(f"dim {dim} ({x.shape[dim]}) is not divisible by the TP size {tp.world}")
    return x.chunk(tp.world, dim=dim)[tp.rank].contiguous()


class _GatherLastDim(torch.autograd.Function):
    """A column-parallel output gathered along the last dim ("fwd"); the gradient split back."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _gather_last(x, tp, "fwd")

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.tp, -1), None


class _SplitLastDim(torch.autograd.Function):
    """A row-parallel input split along the last dim; the gradient gathered back ("bwd")."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _split(x, tp, -1)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.tp, "bwd"), None


class _GatherThenSplit(torch.autograd.Function):
    """The sequence gathered along dim 0 ("fwd") for a computation every rank duplicates: the
    gradient is this rank's slice, not a reduce-scatter."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return tp.all_gather(x.contiguous(), "fwd")

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.tp, 0), None


def _linear(original: Callable) -> Callable:
    """Megatron's linear function with its own collectives turned off: the input is mapped on the
    communicator (copy_to_tp for allreduce_dgrad, gather_from_sp for sequence_parallel) first.
    Those two flags are the only branches under which Megatron's autograd functions communicate."""
    signature = inspect.signature(original)

    def linear(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        a = bound.arguments
        sequence_parallel, allreduce_dgrad = a.get("sequence_parallel", False), a.get("allreduce_dgrad", False)
        if sequence_parallel or allreduce_dgrad:
            tp = _comm(a.get("tp_group"))
            if tp is not None:
                x = a["input"]
                a["input"] = gather_from_sp(x, tp) if sequence_parallel else copy_to_tp(x, tp)
                a["sequence_parallel"] = a["allreduce_dgrad"] = False
        return original(*bound.args, **bound.kwargs)

    # name, doc and attributes: Megatron's function reads attributes of whatever its module
    # name holds (linear_with_grad_accumulation_and_async_allreduce.warned)
    functools.update_wrapper(linear, original)
    linear.__fp4quant__ = True
    return linear
