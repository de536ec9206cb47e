"""The compressed algorithms, as pipelines of codec steps and asynchronous collectives.

two_shot    (all-reduce) pad to (W, S) -> quantize_rows -> all_to_all_single ->
            dequantize_reduce(requantize=True) -> all-gather of the W shard messages ->
            dequantize_rows -> the first N values
one_shot    (all-reduce) quantize_rows(1, N) -> all-gather -> dequantize_reduce(requantize=False)
gather      (all-gather) quantize_rows(1, n) -> all-gather -> dequantize_rows (W, n)
scatter     (reduce-scatter) quantize_rows(W, n) -> all_to_all_single -> dequantize_reduce(requantize=False)

Each works chunk by chunk (fp4quant.comm.plan.chunks); with more than one chunk the
collective of chunk k runs (async_op=True) while the codec works on its neighbours.
``rec`` (a counters.Recorder) counts the bytes each rank sends: (W-1) of its W messages in
an all-to-all or an all-gather.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .. import ops
from . import plan
from .counters import Recorder

all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# False runs each chunk through all its stages before the next one starts (no overlap):
# the benchmark's control for what overlap, rather than smaller buffers, buys.
OVERLAP = True


def _pipeline(items: Sequence[Any], stages: Sequence[Callable[[Any], tuple[Any, Any]]], rec: Recorder) -> None:
    """Run each item through ``stages``; a stage returns (state, work or None) and the next
    stage waits for that work.  While item k's collective is in flight, the codec works on
    item k + 1 (stage 0) and on items k - 1, k - 2 (later stages).  The order in which the
    collectives are issued depends only on the number of items: the same on every rank."""
    queues: list[deque] = [deque() for _ in stages]

    def advance(i: int) -> None:
        state, work = queues[i - 1].popleft()
        if work is not None:
            with rec.comm():
                work.wait()
        result = stages[i](state)
        if i < len(stages) - 1:
            queues[i].append(result)

    depth = 1 if OVERLAP else 0  # items left in flight between stages
    for item in items:
        queues[0].append(stages[0](item))
        for i in range(1, len(stages)):
            while len(queues[i - 1]) > depth:
                advance(i)
    for i in range(1, len(stages)):
        while queues[i - 1]:
            advance(i)


def _issue(rec: Recorder, fn: Callable[..., Any], *args: Any, group: Any, world: int) -> Any:
    if world == 1:
        return None
    with rec.comm(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return fn(*args, group=group, async_op=True)


def _quantize_gather(src, config, group, world, streams, rec):
    """Stage: quantize a chunk of ``src`` (1-D) as one message and all-gather the messages."""

    def quantize(ch: plan.Chunk):
        with rec.codec():
            rows = src[ch.start : ch.start + ch.numel].view(1, -1)
            msg = ops.quantize_rows(rows, config, streams.seed, streams.offset(ch.start))
        gathered = msg.new_empty(world * msg.numel()) if world > 1 else msg
        rec.bytes_sent += (world - 1) * msg.numel()
        return (ch, gathered), _issue(rec, all_gather_flat, gathered, msg.view(-1), group=group, world=world)

    return quantize


def two_shot(flat, config, group, world, streams, rec, chunk_values) -> None:
    block, dtype = config.block, flat.dtype

    def quantize(ch: plan.Chunk):
        S = plan.shard_values(ch.numel, world, block)
        src = flat[ch.start : ch.start + ch.numel]
        if ch.numel < world * S:
            buf = flat.new_zeros(world * S)
            buf[: ch.numel].copy_(src)
            src = buf
        with rec.codec():
            msgs = ops.quantize_rows(src.view(world, S), config, streams.seed, streams.offset(ch.start))
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, S, recv), _issue(rec, dist.all_to_all_single, recv, msgs, group=group, world=world)

    def reduce(state):
        ch, S, recv = state
        with rec.codec():
            shard = ops.dequantize_reduce(recv, S, config, dtype, True, streams.seed, streams.offset(ch.start, True))
        gathered = shard.new_empty(world * shard.numel()) if world > 1 else shard
        rec.bytes_sent += (world - 1) * shard.numel()
        return (ch, S, gathered), _issue(rec, all_gather_flat, gathered, shard, group=group, world=world)

    def finish(state):
        ch, S, gathered = state
        with rec.codec():
            # the shards hold sums: one that overflows the dtype is +-inf, as in dequantize_reduce
            vals = ops.dequantize_rows(gathered.view(world, -1), S, config, dtype, saturate=world == 1)
        flat[ch.start : ch.start + ch.numel].copy_(vals.view(-1)[: ch.numel])
        return None, None

    _pipeline(plan.chunks(flat.numel(), world * block, chunk_values), (quantize, reduce, finish), rec)


def one_shot(flat, config, group, world, streams, rec, chunk_values) -> None:
    dtype = flat.dtype

    quantize = _quantize_gather(flat, config, group, world, streams, rec)

    def finish(state):
        ch, gathered = state
        with rec.codec():
            vals = ops.dequantize_reduce(gathered.view(world, -1), ch.numel, config, dtype, False)
        flat[ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(plan.chunks(flat.numel(), config.block, chunk_values), (quantize, finish), rec)


def gather(src, out, config, group, world, streams, rec, chunk_values) -> None:
    """Compressed all-gather of ``src`` (n,) into ``out`` (world, n), chunked along n."""
    dtype = out.dtype

    quantize = _quantize_gather(src, config, group, world, streams, rec)

    def finish(state):
        ch, gathered = state
        with rec.codec():
            vals = ops.dequantize_rows(gathered.view(world, -1), ch.numel, config, dtype)
        out[:, ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(plan.chunks(src.numel(), config.block, chunk_values), (quantize, finish), rec)


def scatter(src, out, config, group, world, streams, rec, chunk_values) -> None:
    """Compressed reduce-scatter of ``src`` (world, n) into ``out`` (n,), chunked along n.
    Row-batched messages: a chunk starting at value s uses counters from world * s."""
    dtype = out.dtype

    def quantize(ch: plan.Chunk):
        rows = src[:, ch.start : ch.start + ch.numel]
        with rec.codec():
            msgs = ops.quantize_rows(rows.contiguous(), config, streams.seed, streams.offset(world * ch.start))
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, recv), _issue(rec, dist.all_to_all_single, recv, msgs, group=group, world=world)

    def finish(state):
        ch, recv = state
        with rec.codec():
            vals = ops.dequantize_reduce(recv, ch.numel, config, dtype, False)
        out[ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(plan.chunks(out.numel(), config.block, chunk_values), (quantize, finish), rec)


