"""all_reduce, all_gather and reduce_scatter with the tensors on the wire compressed.

Every rank decodes the same bytes with the same ops in the same order, so all ranks end
with bit-identical results (the two-shot's last step decodes the gathered messages,
the rank's own shard included, never its pre-quantization sum).  The FWHT is applied by
the first quantization and inverted by the last decode only: the reduction and the
re-quantization of the two-shot happen in the transformed domain (``dequantize_reduce``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from ..format.config import QuantConfig
from . import algorithms, auto, exchange, plan
from . import validate as vd
from .algorithms import Call
from .counters import Recorder
from .dilation import Dilation
from .streams import CallStreams, RandomStreams
from .wire import Wire

reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# all_reduce pipelines chunks by default (chunk_bytes="auto", see plan.default_chunk_bytes);
# all_gather and reduce_scatter do not (unmeasured), unless asked.
DEFAULT_CHUNK_BYTES = "auto"

WireSpec = Wire | QuantConfig | str | None


def _backend(group: dist.ProcessGroup | None, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors ("cpu:gloo,cuda:nccl" -> "nccl" for CUDA)."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    per_device = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
    return per_device.get(device.type, name)


def _ring_bytes(numel: int, itemsize: int, world: int, factor: int) -> int:
    return factor * (world - 1) * numel * itemsize // world


@dataclass(frozen=True)
class _Setup:
    """One collective's resolved arguments: group, wire and options, checked on every rank."""

    group: Any
    world: int
    rank: int
    wire: Wire
    streams: RandomStreams | None
    stats_key: str
    chunk_bytes: int | str | None
    overlap: bool
    sync_timing: bool
    dilation: Dilation

    def recorder(self, device: torch.device) -> Recorder:
        return Recorder(self.stats_key, device, self.sync_timing, self.dilation)

    def call(self, rec: Recorder, t: torch.Tensor, numel: int) -> Call:
        """The Call of a compressed collective of ``numel`` values per shard (draws its streams)."""
        streams = self.streams.next(self.rank) if self.streams is not None else CallStreams(0, self.rank)
        chunk = plan.chunk_values(self.chunk_bytes, t.element_size(), numel, t.device)
        return Call(self.group, self.world, self.rank, self.wire, streams, rec, chunk, self.overlap)


def _prepare(name: str, group, spec: WireSpec, checks: Callable[[Wire, int], Any], *, validate: bool,
             streams: RandomStreams | None, stats_key: str, chunk_bytes, overlap: bool, sync_timing: bool,
             dilation: Dilation | None, **fields) -> tuple[_Setup | None, Any]:
    """Resolve the group and the wire, run the local checks (which return what they resolved),
    validate across ranks if asked.  (None, None) when this rank is not in the group."""
    rank = dist.get_rank(group)
    if rank < 0:
        return None, None
    world = dist.get_world_size(group)
    error: Exception | None = None
    wire: Wire | None = None
    checked = None
    try:
        wire = Wire.of(spec)
        checked = checks(wire, world)
        vd.check_chunk_bytes(chunk_bytes)
        vd.check_streams(wire, streams)
        if dilation is not None and not isinstance(dilation, Dilation):
            raise TypeError(f"dilation must be a fp4quant.comm.Dilation or None, got {type(dilation).__name__}")
    except (TypeError, ValueError) as exc:
        error, wire = exc, None
    if validate:
        vd.exchange(group, vd.record(name, None if wire is None else wire.config, **fields, chunk_bytes=chunk_bytes,
                                     overlap=overlap), error)
    elif error is not None:
        raise error
    assert wire is not None
    setup = _Setup(group if group is not None else dist.group.WORLD, world, rank, wire, streams, stats_key,
                   chunk_bytes, overlap, sync_timing, dilation or Dilation())
    return setup, checked


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
    dilation: Dilation | None = None,
) -> None:
    """All-reduce ``tensor`` in place over ``group``, compressed under ``config``.

    config      a Wire, a QuantConfig, a preset name, or None; None and the bf16 preset mean a
                plain ``torch.distributed.all_reduce`` (exactly its result); ``Wire.cast()``
                sends a wider tensor as bf16 and casts the result back
    op          "sum" or "avg" (or the matching ``dist.ReduceOp``); avg divides the sum by the
                world size once at the end, in the tensor's dtype
    algorithm   "two_shot" (quantize, all-to-all, FP32 sum of the shard in the transformed
                domain, re-quantize, all-gather, decode: two quantization errors, about
                2 (W-1)/W of the compressed tensor sent per rank), "one_shot" (all-gather
                of the quantized tensors, local FP32 sum: one error, W-1 times the
                compressed tensor sent), or "auto" (by size and world size from the
                benchmark's thresholds, uncompressed below them; see fp4quant.comm.auto)
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
    dilation    the emulated cluster's time dilation (fp4quant.comm.dilation: latency slept
                per wire step, codec ops stretched to the dilated target's); None: none

    World size 1 still runs the codec, so the error is that of any world size.
    """

    def checks(wire: Wire, world: int) -> str:
        vd.check_tensor(tensor, "tensor", wire.kind == "compressed")
        vd.check_algorithm(algorithm)
        return vd.resolve_op(op)

    setup, op_name = _prepare(
        "all_reduce", group, config, checks, validate=validate, streams=streams, stats_key=stats_key,
        chunk_bytes=chunk_bytes, overlap=overlap, sync_timing=sync_timing, dilation=dilation,
        tensor=tensor, op=str(op), algorithm=algorithm,
    )
    if setup is None:
        return
    if setup.wire.narrows(tensor.dtype):
        with torch.no_grad():
            narrow = tensor.to(setup.wire.dtype)
            _all_reduce(narrow, replace(setup, wire=Wire.exact()), op_name, algorithm)
            tensor.copy_(narrow)
        return
    _all_reduce(tensor, setup, op_name, algorithm)


def _all_reduce(tensor: torch.Tensor, setup: _Setup, op_name: str, algorithm: str) -> None:
    world = setup.world
    rec = setup.recorder(tensor.device)
    n, itemsize = tensor.numel(), tensor.element_size()
    rec.bytes_uncompressed = _ring_bytes(n, itemsize, world, 2)
    algo = algorithm if setup.wire.kind == "compressed" else "uncompressed"
    if algo == "auto":
        algo = auto.choose(n * itemsize, world, _backend(setup.group, tensor.device))
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
                dist.all_reduce(flat, group=setup.group)
        else:
            run = algorithms.two_shot if algo == "two_shot" else algorithms.one_shot
            run(flat, setup.call(rec, tensor, n))
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


def _shard_collective(input: torch.Tensor, output: torch.Tensor, setup: _Setup, gathers: bool, divide: bool) -> None:
    """The body of all_gather (``gathers``) and reduce_scatter; a cast wire narrows both tensors."""
    if setup.wire.narrows(input.dtype):
        with torch.no_grad():
            narrow = torch.empty_like(output, dtype=setup.wire.dtype)  # write-only
            _shard_collective(input.to(setup.wire.dtype), narrow, replace(setup, wire=Wire.exact()), gathers, divide)
            output.copy_(narrow)
        return
    world = setup.world
    n = input.numel() if gathers else output.numel()  # values of one rank's shard
    rec = setup.recorder(input.device)
    rec.bytes_uncompressed = (world - 1) * n * input.element_size()
    if n == 0:
        rec.commit()
        return
    with torch.no_grad():
        src = input.reshape(-1).contiguous()
        work = output if output.is_contiguous() else output.contiguous()
        flat = work.view(-1)
        if setup.wire.kind != "compressed":
            rec.bytes_sent = rec.bytes_uncompressed
            with rec.comm():
                rec.wire(world - 1)
                if gathers:  # bit-identical to torch's all-gather; receive-first on gloo
                    exchange.all_gather(flat, src, group=setup.group)
                else:  # torch's (gloo: a ring all-reduce of the whole input, 2x the bytes counted)
                    _quiet(reduce_scatter_flat, flat, src, group=setup.group)
        elif gathers:
            algorithms.gather(src, flat.view(world, n), setup.call(rec, input, n))
        else:
            algorithms.scatter(src.view(world, n), flat, setup.call(rec, input, n))
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
    dilation: Dilation | None = None,
) -> None:
    """Gather every rank's ``input`` into ``output`` (W * input.numel() values, rank order),
    like ``torch.distributed.all_gather_into_tensor``; each input crosses the wire as one
    compressed message, and every rank (the sender too) decodes the same bytes.  The other
    arguments as in all_reduce; chunking is off by default here (not benchmarked)."""

    def checks(wire: Wire, world: int) -> None:
        _check_pair(input, output, wire, big=output, small=input, world=world)

    setup, _ = _prepare(
        "all_gather", group, config, checks, validate=validate, streams=streams, stats_key=stats_key,
        chunk_bytes=chunk_bytes, overlap=overlap, sync_timing=sync_timing, dilation=dilation,
        input=input, output=output,
    )
    if setup is not None:
        _shard_collective(input, output, setup, gathers=True, divide=False)


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
    dilation: Dilation | None = None,
) -> None:
    """Reduce ``input`` (W * output.numel() values) over ``group`` and keep shard r (values
    r * n .. (r + 1) * n - 1) on rank r, like ``torch.distributed.reduce_scatter_tensor``.

    Compressed: each shard-row of the input is one message (the codec pads it to its
    block), all-to-all, then ``dequantize_reduce`` sums the W messages in FP32 in the
    transformed domain and decodes them once (one quantization error).  The other
    arguments as in all_reduce; chunking is off by default here (not benchmarked)."""

    def checks(wire: Wire, world: int) -> str:
        op_name = vd.resolve_op(op)
        _check_pair(input, output, wire, big=input, small=output, world=world)
        return op_name

    setup, op_name = _prepare(
        "reduce_scatter", group, config, checks, validate=validate, streams=streams, stats_key=stats_key,
        chunk_bytes=chunk_bytes, overlap=overlap, sync_timing=sync_timing, dilation=dilation,
        input=input, output=output, op=str(op),
    )
    if setup is not None:
        _shard_collective(input, output, setup, gathers=False, divide=op_name == "avg")
