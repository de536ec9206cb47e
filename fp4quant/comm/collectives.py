"""all_reduce, all_gather and reduce_scatter with the tensors on the wire compressed.

Every rank decodes the same bytes with the same ops in the same order, so all ranks end
with bit-identical results (the two-shot's last step decodes the gathered messages,
the rank's own shard included, never its pre-quantization sum).  The FWHT is applied by
the first quantization and inverted by the last decode only: the reduction and the
re-quantization of the two-shot happen in the transformed domain (``dequantize_reduce``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from ..format.config import QuantConfig
from . import algorithms, auto, plan
from . import validate as vd
from .algorithms import all_gather_flat, reduce_scatter_flat
from .counters import Recorder

# all_reduce pipelines chunks by default (chunk_bytes="auto", see plan.default_chunk_bytes);
# all_gather and reduce_scatter do not (unmeasured), unless asked.
DEFAULT_CHUNK_BYTES = "auto"


def _group_info(group: dist.ProcessGroup | None) -> tuple[int, int, Any]:
    """(world size, rank in group (-1: not a member), key of the group's call counter)."""
    rank = dist.get_rank(group)
    world = dist.get_world_size(group) if rank >= 0 else 0
    return world, rank, group if group is not None else dist.group.WORLD


def _backend(group: dist.ProcessGroup | None, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors ("cpu:gloo,cuda:nccl" -> "nccl" for CUDA)."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    per_device = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
    return per_device.get(device.type, name)


def _ring_bytes(numel: int, itemsize: int, world: int, factor: int) -> int:
    return factor * (world - 1) * numel * itemsize // world


def _prepare(name, group, validate_flag, config, local_checks, **fields):
    """Resolve the group and the config, run the local checks, validate across ranks if asked.
    Returns (config or None, world, rank, group key); world 0: this rank is not in the group."""
    world, rank, key = _group_info(group)
    if world == 0:
        return None, 0, rank, key
    error: Exception | None = None
    try:
        config = vd.resolve_config(config)
        local_checks(config, world)
    except (TypeError, ValueError) as exc:
        error, config = exc, None
    if vd.enabled(validate_flag):
        vd.exchange(group, vd.record(name, config, **fields), error)
    elif error is not None:
        raise error
    return config, world, rank, key


def all_reduce(
    tensor: torch.Tensor,
    config: QuantConfig | str | None = None,
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    *,
    algorithm: str = "two_shot",
    chunk_bytes: int | str | None = DEFAULT_CHUNK_BYTES,
    validate: bool | None = None,
    direction: str = "other",
    seed: int | None = None,
) -> None:
    """All-reduce ``tensor`` in place over ``group``, compressed under ``config``.

    config      a QuantConfig, a preset name, or None; None and the bf16 preset mean a plain
                ``torch.distributed.all_reduce`` (exactly its result)
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
                For block-local configs (all but nvfp4's per-tensor scale) the result is
                bit for bit the same whatever the chunking.
    validate    exchange shapes, dtype, config, op and algorithm first and raise the same
                ValueError on every rank on a mismatch (default: env FP4QUANT_VALIDATE)
    direction   the stats() key the call is counted under ("fwd", "bwd", ...)
    seed        base seed of stochastic rounding (see fp4quant.comm.plan); None: 0

    World size 1 still runs the codec, so the error is that of any world size.
    """
    op_name = None

    def checks(cfg: QuantConfig | None, world: int) -> None:
        nonlocal op_name
        vd.check_tensor(tensor, "tensor", cfg is not None)
        op_name = vd.resolve_op(op)
        vd.check_algorithm(algorithm)
        vd.check_chunk_bytes(chunk_bytes)

    config, world, rank, key = _prepare(
        "all_reduce", group, validate, config, checks,
        tensor=tensor, op=str(op), algorithm=algorithm, chunk_bytes=chunk_bytes,
    )
    if world == 0:
        return
    rec = Recorder(direction, tensor.device)
    n, itemsize = tensor.numel(), tensor.element_size()
    rec.bytes_uncompressed = _ring_bytes(n, itemsize, world, 2)
    algo = "uncompressed" if config is None else algorithm
    if algo == "auto":
        algo = auto.choose(n * itemsize, world, _backend(group, tensor.device))
    if n == 0:
        rec.commit()
        return
    with torch.no_grad():
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        flat = work.view(-1)
        if algo == "uncompressed":
            rec.bytes_sent = rec.bytes_uncompressed
            with rec.comm():
                dist.all_reduce(flat, group=group)
        else:
            streams = plan.streams(key, rank, seed)
            run = algorithms.two_shot if algo == "two_shot" else algorithms.one_shot
            run(flat, config, group, world, streams, rec, plan.chunk_values(chunk_bytes, itemsize, n, tensor.device))
        if op_name == "avg":
            flat.div_(world)
        if work is not tensor:
            tensor.copy_(work)
    rec.commit()


def _check_pair(input, output, cfg, chunk_bytes, *, big, small, world) -> None:
    """Checks of an all-gather / reduce-scatter: ``big`` holds world x ``small`` values."""
    vd.check_tensor(input, "input", cfg is not None)
    vd.check_tensor(output, "output", cfg is not None)
    vd.check_chunk_bytes(chunk_bytes)
    if output.dtype != input.dtype:
        raise TypeError(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    if big.numel() != world * small.numel():
        name = "output" if big is output else "input"
        raise ValueError(f"{name} has {big.numel()} values, expected world size {world} x {small.numel()}")


def _gather_or_scatter(input, output, n, config, group, world, rank, key, direction, seed, chunk_bytes,
                       uncompressed, compressed, divide_by) -> None:
    """The shared body of all_gather and reduce_scatter (n: values per rank's shard)."""
    rec = Recorder(direction, input.device)
    itemsize = input.element_size()
    rec.bytes_uncompressed = (world - 1) * n * itemsize
    if n == 0:
        rec.commit()
        return
    with torch.no_grad():
        src = input.reshape(-1).contiguous()
        work = output if output.is_contiguous() else output.contiguous()
        flat = work.view(-1)
        if config is None:
            rec.bytes_sent = rec.bytes_uncompressed
            with rec.comm(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                uncompressed(flat, src, group=group)
        else:
            streams = plan.streams(key, rank, seed)
            compressed(src, flat, streams, rec, plan.chunk_values(chunk_bytes, itemsize, n, input.device))
        if divide_by != 1:
            flat.div_(divide_by)
        if work is not output:
            output.copy_(work)
    rec.commit()


def all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    config: QuantConfig | str | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    chunk_bytes: int | str | None = None,
    validate: bool | None = None,
    direction: str = "other",
    seed: int | None = None,
) -> None:
    """Gather every rank's ``input`` into ``output`` (W * input.numel() values, rank order),
    like ``torch.distributed.all_gather_into_tensor``; each input crosses the wire as one
    compressed message, and every rank (the sender too) decodes the same bytes.
    ``chunk_bytes`` (None, "auto" or bytes of input per chunk), ``validate``, ``direction``
    and ``seed`` as in all_reduce; chunking is off by default here (not benchmarked)."""

    def checks(cfg: QuantConfig | None, world: int) -> None:
        _check_pair(input, output, cfg, chunk_bytes, big=output, small=input, world=world)

    config, world, rank, key = _prepare(
        "all_gather", group, validate, config, checks, input=input, output=output, chunk_bytes=chunk_bytes
    )
    if world == 0:
        return
    def compressed(src, flat, streams, rec, chunk):
        algorithms.gather(src, flat.view(world, src.numel()), config, group, world, streams, rec, chunk)

    _gather_or_scatter(input, output, input.numel(), config, group, world, rank, key, direction, seed, chunk_bytes,
                       all_gather_flat, compressed, divide_by=1)


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    config: QuantConfig | str | None = None,
    group: dist.ProcessGroup | None = None,
    op: str = "sum",
    *,
    chunk_bytes: int | str | None = None,
    validate: bool | None = None,
    direction: str = "other",
    seed: int | None = None,
) -> None:
    """Reduce ``input`` (W * output.numel() values) over ``group`` and keep shard r (values
    r * n .. (r + 1) * n - 1) on rank r, like ``torch.distributed.reduce_scatter_tensor``.

    Compressed: each shard-row of the input is one message (the codec pads it to its
    block), all-to-all, then ``dequantize_reduce`` sums the W messages in FP32 in the
    transformed domain and decodes them once (one quantization error).  ``op``,
    ``chunk_bytes`` (off by default: not benchmarked), ``validate``, ``direction`` and
    ``seed`` as in all_reduce."""
    op_name = None

    def checks(cfg: QuantConfig | None, world: int) -> None:
        nonlocal op_name
        op_name = vd.resolve_op(op)
        _check_pair(input, output, cfg, chunk_bytes, big=input, small=output, world=world)

    config, world, rank, key = _prepare(
        "reduce_scatter", group, validate, config, checks,
        input=input, output=output, op=str(op), chunk_bytes=chunk_bytes,
    )
    if world == 0:
        return
    def compressed(src, flat, streams, rec, chunk):
        algorithms.scatter(src.view(world, flat.numel()), flat, config, group, world, streams, rec, chunk)

    _gather_or_scatter(input, output, output.numel(), config, group, world, rank, key, direction, seed, chunk_bytes,
                       reduce_scatter_flat, compressed, divide_by=world if op_name == "avg" else 1)
