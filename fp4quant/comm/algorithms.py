"""The compressed algorithms, as pipelines of codec steps and asynchronous collectives.

two_shot    (all-reduce) pad to (W, S) -> quantize_rows -> all-to-all ->
            dequantize_reduce(requantize=True) -> all-gather of the W shard messages ->
            dequantize_rows -> the first N values (decoded in place where there is no padding)
one_shot    (all-reduce) quantize_rows(1, N) -> all-gather -> dequantize_reduce(requantize=False)
gather      (all-gather) quantize_rows(1, n) -> all-gather -> dequantize_rows (W, n)
scatter     (reduce-scatter) quantize_rows(W, n) -> all-to-all -> dequantize_reduce(requantize=False)

Each takes its tensors and one ``Call`` (group, world, rank, wire, streams, recorder,
chunking, overlap), built once per collective by fp4quant.comm.collectives.  Each works
chunk by chunk (fp4quant.comm.plan.chunks); with more than one chunk the collective of
chunk k runs (async_op=True) while the codec works on its neighbours.  The all-to-alls
and all-gathers are fp4quant.comm.exchange's (on gloo: every receive posted before any
send).  ``call.rec`` (a counters.Recorder) counts the bytes each rank sends: (W-1) of its W
messages in an all-to-all or an all-gather, and the W-1 wire steps of each (where the
emulated cluster's dilation sleeps their latency); each codec op tells it the bytes the
target's op moves (values at dilation.TARGET_VALUE_BYTES, messages at their own size): its
codec stretch.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import ops
from . import exchange, plan
from .counters import Recorder
from .dilation import TARGET_VALUE_BYTES as VB
from .streams import CallStreams
from .wire import Wire


@dataclass(frozen=True)
class Call:
    """Everything one compressed collective needs, resolved once by the caller."""

    group: Any  # the process group (None: the default group)
    world: int
    rank: int
    wire: Wire  # a compressed wire: its config is the codec's
    streams: CallStreams  # this call's seed and counter offsets on this rank
    rec: Recorder
    chunk_values: int | None  # values per pipeline chunk (None: one chunk)
    overlap: bool = True  # False: each chunk through all stages before the next (the benchmark's control)

    @property
    def config(self):
        return self.wire.config

    def issue(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Start an asynchronous collective on the group (None on one rank: nothing to send)."""
        if self.world == 1:
            return None
        with self.rec.comm(), warnings.catch_warnings():
            self.rec.wire(self.world - 1)  # an all-to-all or all-gather: W-1 steps
            warnings.simplefilter("ignore", FutureWarning)
            return fn(*args, group=self.group, async_op=True)

    def chunks(self, numel: int, unit: int) -> list[plan.Chunk]:
        return plan.chunks(numel, unit, self.chunk_values)


def _pipeline(items: Sequence[Any], stages: Sequence[Callable[[Any], tuple[Any, Any]]], call: Call) -> None:
    """Run each item through ``stages``; a stage returns (state, work or None) and the next
    stage waits for that work.  While item k's collective is in flight, the codec works on
    item k + 1 (stage 0) and on items k - 1, k - 2 (later stages).  The order in which the
    collectives are issued depends only on the number of items: the same on every rank."""
    queues: list[deque] = [deque() for _ in stages]

    def advance(i: int) -> None:
        state, work = queues[i - 1].popleft()
        if work is not None:
            with call.rec.comm():
                work.wait()
        result = stages[i](state)
        if i < len(stages) - 1:
            queues[i].append(result)

    depth = 1 if call.overlap else 0  # items left in flight between stages
    for item in items:
        queues[0].append(stages[0](item))
        for i in range(1, len(stages)):
            while len(queues[i - 1]) > depth:
                advance(i)
    for i in range(1, len(stages)):
        while queues[i - 1]:
            advance(i)


def _quantize_gather(src: torch.Tensor, call: Call):
    """Stage: quantize a chunk of ``src`` (1-D) as one message and all-gather the messages."""
    world, rec = call.world, call.rec

    def quantize(ch: plan.Chunk):
        with rec.codec("quantize") as op:
            rows = src[ch.start : ch.start + ch.numel].view(1, -1)
            msg = ops.quantize_rows(rows, call.config, call.streams.seed, call.streams.offset(ch.start))
            op.bytes_moved = VB * ch.numel + msg.numel()
        gathered = msg.new_empty(world * msg.numel()) if world > 1 else msg
        rec.bytes_sent += (world - 1) * msg.numel()
        return (ch, gathered), call.issue(exchange.all_gather, gathered, msg.view(-1))

    return quantize


def two_shot(flat: torch.Tensor, call: Call) -> None:
    """Compressed all-reduce of the 1-D ``flat``, in place."""
    world, rec, config, dtype = call.world, call.rec, call.config, flat.dtype
    seed = call.streams.seed

    def quantize(ch: plan.Chunk):
        S = plan.shard_values(ch.numel, world, config.block)
        src = flat[ch.start : ch.start + ch.numel]
        if ch.numel < world * S:
            buf = flat.new_zeros(world * S)
            buf[: ch.numel].copy_(src)
            src = buf
        with rec.codec("quantize") as op:
            msgs = ops.quantize_rows(src.view(world, S), config, seed, call.streams.offset(ch.start))
            op.bytes_moved = VB * world * S + msgs.numel()
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, S, recv), call.issue(exchange.all_to_all, recv, msgs)

    def reduce(state):
        ch, S, recv = state
        with rec.codec("dequantize") as op:
            shard = ops.dequantize_reduce(recv, S, config, dtype, requantize=True, seed=seed,
                                          offset=call.streams.offset(ch.start, requant=True))
            op.bytes_moved = recv.numel() + shard.numel()
        gathered = shard.new_empty(world * shard.numel()) if world > 1 else shard
        rec.bytes_sent += (world - 1) * shard.numel()
        return (ch, S, gathered), call.issue(exchange.all_gather, gathered, shard)

    def finish(state):
        ch, S, gathered = state
        with rec.codec("dequantize") as op:
            # the shards hold sums: one that overflows the dtype is +-inf, as in dequantize_reduce
            dest = flat[ch.start : ch.start + ch.numel]
            if ch.numel == world * S:  # no padding: decode in place (flat is contiguous)
                ops.dequantize_rows(gathered.view(world, -1), S, config, dtype, saturate=world == 1,
                                    out=dest.view(world, S))
            else:
                vals = ops.dequantize_rows(gathered.view(world, -1), S, config, dtype, saturate=world == 1)
                dest.copy_(vals.view(-1)[: ch.numel])
            op.bytes_moved = gathered.numel() + VB * world * S
        return None, None

    _pipeline(call.chunks(flat.numel(), world * config.block), (quantize, reduce, finish), call)


def one_shot(flat: torch.Tensor, call: Call) -> None:
    """Compressed all-reduce of the 1-D ``flat``, in place: one quantization error."""
    world, dtype = call.world, flat.dtype

    def finish(state):
        ch, gathered = state
        with call.rec.codec("dequantize") as op:
            vals = ops.dequantize_reduce(gathered.view(world, -1), ch.numel, call.config, dtype, requantize=False)
            op.bytes_moved = gathered.numel() + VB * ch.numel
        flat[ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(call.chunks(flat.numel(), call.config.block), (_quantize_gather(flat, call), finish), call)


def gather(src: torch.Tensor, out: torch.Tensor, call: Call) -> None:
    """Compressed all-gather of ``src`` (n,) into ``out`` (world, n), chunked along n."""
    world, dtype = call.world, out.dtype

    def finish(state):
        ch, gathered = state
        with call.rec.codec("dequantize") as op:
            dest = out[:, ch.start : ch.start + ch.numel]
            if dest.is_contiguous():  # one chunk of a contiguous out: decode in place
                ops.dequantize_rows(gathered.view(world, -1), ch.numel, call.config, dtype, out=dest)
            else:
                dest.copy_(ops.dequantize_rows(gathered.view(world, -1), ch.numel, call.config, dtype))
            op.bytes_moved = gathered.numel() + VB * world * ch.numel
        return None, None

    _pipeline(call.chunks(src.numel(), call.config.block), (_quantize_gather(src, call), finish), call)


def scatter(src: torch.Tensor, out: torch.Tensor, call: Call) -> None:
    """Compressed reduce-scatter of ``src`` (world, n) into ``out`` (n,), chunked along n.
    Row-batched messages: a chunk starting at value s uses counters from world * s."""
    world, rec, config, dtype = call.world, call.rec, call.config, out.dtype

    def quantize(ch: plan.Chunk):
        rows = src[:, ch.start : ch.start + ch.numel]
        with rec.codec("quantize") as op:
            msgs = ops.quantize_rows(rows.contiguous(), config, call.streams.seed,
                                     call.streams.offset(world * ch.start))
            op.bytes_moved = VB * rows.numel() + msgs.numel()
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, recv), call.issue(exchange.all_to_all, recv, msgs)

    def finish(state):
        ch, recv = state
        with rec.codec("dequantize") as op:
            vals = ops.dequantize_reduce(recv, ch.numel, config, dtype, requantize=False)
            op.bytes_moved = recv.numel() + VB * ch.numel
        out[ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(call.chunks(out.numel(), config.block), (quantize, finish), call)
