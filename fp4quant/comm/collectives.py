"""all_reduce, all_gather and reduce_scatter with the tensors on the wire compressed.

Every rank decodes the same bytes with the same ops in the same order, so all ranks end
with bit-identical results (the two-shot's last step decodes the gathered messages,
the rank's own shard included, never its pre-quantization sum).  The FWHT is applied by
the first quantization and inverted by the last decode only: the reduction and the
re-quantization of the two-shot happen in the transformed domain (``dequantize_reduce``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from ..format.config import QuantConfig
from . import algorithms, auto, exchange, plan
from . import validate as vd
from .algorithms import Call
from .counters import Recorder
from .layout import NodeLayout
from .local import is_local
from .options import Options
from .streams import RandomStreams
from .wire import Wire

reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# all_reduce pipelines chunks by default (chunk_bytes="auto", see plan.default_chunk_bytes);
# all_gather and reduce_scatter do not (unmeasured), unless asked.
DEFAULT_CHUNK_BYTES = "auto"

WireSpec = Wire | QuantConfig | str | None


def _backend(group: dist.ProcessGroup | None, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors ("cpu:gloo,cuda:nccl" -> "nccl" for CUDA)."""
    if is_local(group):
        return "local"
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    per_device = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
    return per_device.get(device.type, name)


def _ring_bytes(numel: int, itemsize: int, world: int, factor: int) -> int:
    return factor * (world - 1) * numel * itemsize // world


def _options(options: Options | None, config: WireSpec, **fields) -> Options:
    """The call's Options: the caller's, or one built from the functional API's arguments."""
    if options is None:
        return Options(wire=config, **fields)
    if not isinstance(options, Options):
        raise TypeError(f"options must be a fp4quant.comm.Options, got {type(options).__name__}")
    if config is not None:
        raise TypeError("pass the wire either as config or in options, not both")
    return options


def _prepare(name: str, group, options: Options, streams: RandomStreams | None, checks: Callable[[Wire, int], Any],
             sizing: torch.Tensor, numel: int, **fields) -> tuple[Call | None, Any]:
    """Resolve the group and the wire, run the local checks (which return what they resolved),
    validate across ranks if asked (``fields``: the tensors and arguments compared), and build
    the call: chunked for ``numel`` values of ``sizing``'s dtype, timed on its device.
    (None, None) when this rank is not in the group."""
    rank = group.rank if is_local(group) else dist.get_rank(group)
    if rank < 0:
        return None, None
    world = group.world if is_local(group) else dist.get_world_size(group)
    error: Exception | None = None
    wire: Wire | None = None
    checked = None
    try:
        wire = Wire.of(options.wire)
        checked = checks(wire, world)
        vd.check_algorithm(options.algorithm)
        vd.check_chunk_bytes(options.chunk_bytes)
        vd.check_intra_wire(options.intra_wire)
        vd.check_streams(wire, streams)
    except (TypeError, ValueError) as exc:
        error, wire = exc, None
    if options.validate:
        vd.exchange(group, vd.record(name, None if wire is None else wire.config, **fields, **options.record()), error)
    elif error is not None:
        raise error
    assert wire is not None
    chunk = plan.chunk_values(options.chunk_bytes, sizing.element_size(), numel, sizing.device)
    rec = Recorder(options.stats_key, sizing.device, options.sync_timing)
    call = Call(group if group is not None else dist.group.WORLD, world, rank, wire, options, streams, rec, chunk)
    return call, checked


def all_reduce(
    tensor: torch.Tensor,
    config: WireSpec = None,
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    *,
    algorithm: str = "two_shot",
    chunk_bytes: int | str | None = DEFAULT_CHUNK_BYTES,
    validate: bool = False,
    stats_key: str = "other",
    streams: RandomStreams | None = None,
    overlap: bool = True,
    sync_timing: bool = False,
    ranks_per_node: int | None = None,
    intra_wire: str = "exact",
    options: Options | None = None,
) -> None:
    """All-reduce ``tensor`` in place over ``group``, compressed under ``config``.

    config      a Wire, a QuantConfig, a preset name, or None; None and the bf16 preset mean a
                plain ``torch.distributed.all_reduce`` (exactly its result); ``Wire.cast()``
                sends a wider tensor as bf16 and casts the result back
    op          "sum" or "avg" (or the matching ``dist.ReduceOp``); avg divides the sum by the
                world size once at the end, in the tensor's dtype; "max" on an uncompressed
                wire only
    algorithm   "two_shot" (quantize, all-to-all, FP32 sum of the shard in the transformed
                domain, re-quantize, all-gather, decode: two quantization errors, about
                2 (W-1)/W of the compressed tensor sent per rank), "one_shot" (all-gather
                of the quantized tensors, local FP32 sum: one error, W-1 times the
                compressed tensor sent), "hierarchical" (a reduce-scatter inside each node
                in the tensor's dtype, the two-shot between nodes among the ranks of one
                local index on a 1/L shard, an all-gather inside the node: what crosses
                nodes is compressed, what stays inside is not; any wire, exact included;
                the node layout from ranks_per_node or torchrun's LOCAL_WORLD_SIZE), or
                "auto" (by size and world size from the benchmark's thresholds,
                uncompressed below them, hierarchical where the layout has several nodes
                of several ranks; see fp4quant.comm.auto)
    chunk_bytes pipeline chunks of this many input bytes (the codec of one chunk overlaps the
                communication of the previous one); None: one chunk; "auto": the measured
                policy of plan.default_chunk_bytes (CPU: one chunk below 32 MiB, else
                max(4 MiB, size / 16); CUDA: one chunk).
                For block-local configs (all but a per-tensor coarse scale, as nvfp4's)
                the result is bit for bit the same whatever the chunking, stochastic
                rounding included: each random draw is keyed by its value's position in
                the tensor (fp4quant.comm.streams), never by its chunk; so for
                all_gather and reduce_scatter.
    validate    exchange what decides the call's messages (shapes, dtype, config, op,
                algorithm, chunking, overlap) first and raise the same ValueError on every
                rank on a mismatch, or on a rank left waiting for one that does not validate
                (fp4quant.comm.validate: through the group's store, no collective)
    stats_key   the stats() key the call is counted under ("fwd", "bwd", ...)
    streams     the caller's RandomStreams (fp4quant.comm.streams): a compressed call draws
                the next stream from it; needed with stochastic rounding
    overlap     False: each pipeline chunk through all its stages before the next (the
                benchmark's control for what overlap buys)
    sync_timing on CUDA, synchronize around timed steps so stats() holds GPU durations
    ranks_per_node, intra_wire: the hierarchical all-reduce's (fp4quant.comm.Options)
    options     all of the above but op, group and streams as one fp4quant.comm.Options
                (what a caller sending many collectives alike builds once); it replaces
                config and the keyword options

    World size 1 still runs the codec, so the error is that of any world size.
    """
    options = _options(options, config, algorithm=algorithm, chunk_bytes=chunk_bytes, validate=validate,
                       stats_key=stats_key, overlap=overlap, sync_timing=sync_timing, ranks_per_node=ranks_per_node,
                       intra_wire=intra_wire)

    def checks(wire: Wire, world: int) -> tuple[str, NodeLayout | None]:
        vd.check_tensor(tensor, "tensor", wire.kind == "compressed")
        op_name = vd.resolve_op(op)
        if op_name == "max" and (wire.kind == "compressed" or options.algorithm == "hierarchical"):
            raise ValueError("op 'max' needs the plain uncompressed all-reduce (a sum of quantized values has no max)")
        layout = None
        if options.algorithm == "hierarchical":
            layout = NodeLayout.of(group, options.ranks_per_node)
        elif options.algorithm == "auto" and (options.ranks_per_node or os.environ.get("LOCAL_WORLD_SIZE")):
            try:
                layout = NodeLayout.of(group, options.ranks_per_node)
            except ValueError:  # auto: an uneven layout is not a hierarchy
                layout = None
        return op_name, layout

    call, checked = _prepare("all_reduce", group, options, streams, checks, tensor, tensor.numel(),
                             tensor=tensor, op=str(op))
    if call is None:
        return
    op_name, layout = checked
    if call.wire.narrows(tensor.dtype):
        with torch.no_grad():
            narrow = tensor.to(call.wire.dtype)
            _all_reduce(narrow, replace(call, wire=Wire.exact()), op_name, layout)
            tensor.copy_(narrow)
        return
    _all_reduce(tensor, call, op_name, layout)


def _all_reduce(tensor: torch.Tensor, call: Call, op_name: str, layout: NodeLayout | None = None) -> None:
    world, rec = call.world, call.rec
    n, itemsize = tensor.numel(), tensor.element_size()
    rec.bytes_uncompressed = _ring_bytes(n, itemsize, world, 2)
    algo = call.options.algorithm
    if algo != "hierarchical" and call.wire.kind != "compressed":
        algo = "uncompressed"
    if algo == "auto":
        algo = auto.choose(n * itemsize, world, _backend(call.group, tensor.device), layout)
    if n == 0:
        rec.commit()
        return
    with torch.no_grad():
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        flat = work.view(-1)
        if algo == "uncompressed":
            rec.bytes_sent = rec.bytes_uncompressed
            with rec.comm():
                rec.wire(2 * (world - 1))  # a ring: reduce-scatter then all-gather
                if is_local(call.group):
                    call.group.all_reduce(flat, op_name)
                else:
                    dist.all_reduce(flat, op=dist.ReduceOp.MAX if op_name == "max" else dist.ReduceOp.SUM,
                                    group=call.group)
        elif algo == "hierarchical":
            algorithms.hierarchical(flat, call, layout)
        else:
            run = algorithms.two_shot if algo == "two_shot" else algorithms.one_shot
            run(flat, call)
        if op_name == "avg":
            flat.div_(world)
        if work is not tensor:
            tensor.copy_(work)
    rec.commit()


def _check_pair(input, output, wire: Wire, *, big, small, world) -> None:
    """Checks of an all-gather / reduce-scatter: ``big`` holds world x ``small`` values."""
    vd.check_tensor(input, "input", wire.kind == "compressed")
    vd.check_tensor(output, "output", wire.kind == "compressed")
    if output.dtype != input.dtype:
        raise TypeError(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    if big.numel() != world * small.numel():
        name = "output" if big is output else "input"
        raise ValueError(f"{name} has {big.numel()} values, expected world size {world} x {small.numel()}")


def _shard_collective(input: torch.Tensor, output: torch.Tensor, call: Call, gathers: bool, divide: bool) -> None:
    """The body of all_gather (``gathers``) and reduce_scatter; a cast wire narrows both tensors."""
    if call.wire.narrows(input.dtype):
        with torch.no_grad():
            narrow = torch.empty_like(output, dtype=call.wire.dtype)  # write-only
            _shard_collective(input.to(call.wire.dtype), narrow, replace(call, wire=Wire.exact()), gathers, divide)
            output.copy_(narrow)
        return
    world, rec = call.world, call.rec
    n = input.numel() if gathers else output.numel()  # values of one rank's shard
    rec.bytes_uncompressed = (world - 1) * n * input.element_size()
    if n == 0:
        rec.commit()
        return
    with torch.no_grad():
        src = input.reshape(-1).contiguous()
        work = output if output.is_contiguous() else output.contiguous()
        flat = work.view(-1)
        if call.wire.kind != "compressed":
            rec.bytes_sent = rec.bytes_uncompressed
            with rec.comm():
                rec.wire(world - 1)
                if gathers:  # bit-identical to torch's all-gather; receive-first on gloo
                    exchange.all_gather(flat, src, group=call.group)
                elif is_local(call.group):
                    call.group.reduce_scatter(flat, src)
                else:  # torch's (gloo: a ring all-reduce of the whole input, 2x the bytes counted)
                    _quiet(reduce_scatter_flat, flat, src, group=call.group)
        elif gathers:
            algorithms.gather(src, flat.view(world, n), call)
        else:
            algorithms.scatter(src.view(world, n), flat, call)
        if divide:
            flat.div_(world)
        if work is not output:
            output.copy_(work)
    rec.commit()


def _quiet(fn, *args, **kwargs):
    """A torch collective without the FutureWarning of its deprecated spelling."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return fn(*args, **kwargs)


def all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    config: WireSpec = None,
    group: dist.ProcessGroup | None = None,
    *,
    chunk_bytes: int | str | None = None,
    validate: bool = False,
    stats_key: str = "other",
    streams: RandomStreams | None = None,
    overlap: bool = True,
    sync_timing: bool = False,
    options: Options | None = None,
) -> None:
    """Gather every rank's ``input`` into ``output`` (W * input.numel() values, rank order),
    like ``torch.distributed.all_gather_into_tensor``; each input crosses the wire as one
    compressed message, and every rank (the sender too) decodes the same bytes.  The other
    arguments as in all_reduce; chunking is off by default here (not benchmarked)."""
    options = _options(options, config, chunk_bytes=chunk_bytes, validate=validate, stats_key=stats_key,
                       overlap=overlap, sync_timing=sync_timing)

    def checks(wire: Wire, world: int) -> None:
        _check_pair(input, output, wire, big=output, small=input, world=world)

    call, _ = _prepare("all_gather", group, options, streams, checks, input, input.numel(), input=input, output=output)
    if call is not None:
        _shard_collective(input, output, call, gathers=True, divide=False)


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    config: WireSpec = None,
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    *,
    chunk_bytes: int | str | None = None,
    validate: bool = False,
    stats_key: str = "other",
    streams: RandomStreams | None = None,
    overlap: bool = True,
    sync_timing: bool = False,
    options: Options | None = None,
) -> None:
    """Reduce ``input`` (W * output.numel() values) over ``group`` and keep shard r (values
    r * n .. (r + 1) * n - 1) on rank r, like ``torch.distributed.reduce_scatter_tensor``.

    Compressed: each shard-row of the input is one message (the codec pads it to its
    block), all-to-all, then ``dequantize_reduce`` sums the W messages in FP32 in the
    transformed domain and decodes them once (one quantization error).  The other
    arguments as in all_reduce; chunking is off by default here (not benchmarked)."""
    options = _options(options, config, chunk_bytes=chunk_bytes, validate=validate, stats_key=stats_key,
                       overlap=overlap, sync_timing=sync_timing)

    def checks(wire: Wire, world: int) -> str:
        op_name = vd.resolve_op(op)
        if op_name == "max":
            raise ValueError("reduce_scatter takes op 'sum' or 'avg'")
        _check_pair(input, output, wire, big=input, small=output, world=world)
        return op_name

    call, op_name = _prepare("reduce_scatter", group, options, streams, checks, input, output.numel(),
                             input=input, output=output, op=str(op))
    if call is not None:
        _shard_collective(input, output, call, gathers=False, divide=op_name == "avg")
