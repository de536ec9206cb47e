"""The compressed algorithms, as pipelines of codec steps and asynchronous collectives.

two_shot    (all-reduce) pad to (W, S) -> quantize_rows -> all-to-all ->
            dequantize_reduce(requantize=True) -> all-gather of the W shard messages ->
            dequantize_rows -> the first N values (decoded in place where there is no padding)
one_shot    (all-reduce) quantize_rows(1, N) -> all-gather -> dequantize_reduce(requantize=False)
hierarchical (all-reduce over nodes) reduce-scatter inside the node (the tensor's dtype) ->
            two-shot among the rail's ranks on the node-shard -> all-gather inside the node
gather      (all-gather) quantize_rows(1, n) -> all-gather -> dequantize_rows (W, n)
scatter     (reduce-scatter) quantize_rows(W, n) -> all-to-all -> dequantize_reduce(requantize=False)

Each takes its tensors and one ``Call`` (group, world, rank, wire, the caller's Options,
random streams, recorder, chunking), built once per collective by
fp4quant.comm.collectives.  Each works chunk by chunk (fp4quant.comm.plan.chunks); with
more than one chunk the collective of chunk k runs (async_op=True) while the codec works
on its neighbours.  The all-to-alls and all-gathers are fp4quant.comm.exchange's (on
gloo: every receive posted before any send).  ``call.rec`` (a counters.Recorder) counts
the bytes each rank sends: (W-1) of its W messages in an all-to-all or an all-gather, and
the W-1 wire steps of each; each codec op tells it the values it handled and its
messages' bytes (what installed hooks, fp4quant.comm.hooks, are told).

Stochastic rounding draws each value's uniform by its position in the whole call
(fp4quant.comm.streams), never by its chunk, so chunking changes no bit of the result of a
block-local config (every one but a per-tensor scale, whose scale is the chunk's).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from .. import ops
from ..format.packed import join_messages, layout, slice_messages
from . import exchange, plan
from .counters import Recorder
from .layout import NodeLayout
from .options import Options
from .streams import CallStreams, RandomStreams, derive
from .wire import Wire


@dataclass(frozen=True)
class Call:
    """Everything one collective needs, resolved once when it is prepared."""

    group: Any  # the process group
    world: int
    rank: int
    wire: Wire  # resolved from options.wire (a cast wire's narrowed call: exact); compressed: the codec's config
    options: Options  # the caller's, unchanged
    random: RandomStreams | None  # the caller's random streams (stochastic rounding)
    rec: Recorder
    chunk_values: int | None  # values per pipeline chunk (None: one chunk)

    @cached_property
    def streams(self) -> CallStreams:
        """This call's seed and counter offsets on this rank, drawn from the caller's streams at
        first use: only a compressed algorithm that runs draws (exact wires, empty tensors and
        an "auto" that stays uncompressed do not)."""
        return self.random.next(self.rank) if self.random is not None else CallStreams(0, self.rank)

    @property
    def config(self):
        return self.wire.config

    @property
    def overlap(self) -> bool:
        return self.options.overlap

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
            op.values, op.message_bytes = ch.numel, msg.numel()
        gathered = msg.new_empty(world * msg.numel()) if world > 1 else msg
        rec.bytes_sent += (world - 1) * msg.numel()
        return (ch, gathered), call.issue(exchange.all_gather, gathered, msg.view(-1))

    return quantize


def _reduce_requantize(recv: torch.Tensor, S: int, first: int, shard: int, call: Call, dtype: torch.dtype):
    """This rank's reduced shard (values ``first`` .. ``first + S - 1`` of the padded flat
    tensor, the sum of the W messages ``recv``) re-quantized as one message, each value with
    the counter it has in a one-chunk call (``shard``: that call's S).  A chunk's shard that
    straddles two one-chunk shards is reduced run by run (plan.owner_runs) and the messages
    joined: the runs are whole blocks, each encoded on its own, so the bytes are those of one
    reduce with the counters of each run."""
    config, seed = call.config, call.streams.seed
    runs = plan.owner_runs(first, S, shard)
    # one reduce where the counters cannot matter (round-to-nearest draws nothing) or cannot
    # be split (a per-tensor scale spans the runs: chunking changes its bits anyway)
    if len(runs) == 1 or config.rounding != "stochastic" or config.coarse_scale == "tensor":
        return ops.dequantize_reduce(recv, S, config, dtype, requantize=True, seed=seed,
                                     offset=call.streams.offset_requant(first, shard))
    parts = []
    for start, count in runs:
        msgs = slice_messages(recv, S, config, start - first, start - first + count)
        parts.append(ops.dequantize_reduce(msgs, count, config, dtype, requantize=True, seed=seed,
                                           offset=call.streams.offset_requant(start, shard)))
    return join_messages(parts, [count for _, count in runs], config)


def two_shot(flat: torch.Tensor, call: Call) -> None:
    """Compressed all-reduce of the 1-D ``flat``, in place.  Chunks change no bit of a
    block-local config's result: the stochastic-rounding draws follow the values' positions."""
    world, rec, config, dtype = call.world, call.rec, call.config, flat.dtype
    seed = call.streams.seed
    shard = plan.shard_values(flat.numel(), world, config.block)  # one chunk's S

    def quantize(ch: plan.Chunk):
        S = plan.shard_values(ch.numel, world, config.block)
        src = flat[ch.start : ch.start + ch.numel]
        if ch.numel < world * S:
            buf = flat.new_zeros(world * S)
            buf[: ch.numel].copy_(src)
            src = buf
        with rec.codec("quantize") as op:
            msgs = ops.quantize_rows(src.view(world, S), config, seed, call.streams.offset(ch.start))
            op.values, op.message_bytes = world * S, msgs.numel()
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, S, recv), call.issue(exchange.all_to_all, recv, msgs)

    def reduce(state):
        ch, S, recv = state
        with rec.codec("dequantize") as op:
            mine = _reduce_requantize(recv, S, ch.start + call.rank * S, shard, call, dtype)
            op.values, op.message_bytes = 0, recv.numel() + mine.numel()  # message to message
        gathered = mine.new_empty(world * mine.numel()) if world > 1 else mine
        rec.bytes_sent += (world - 1) * mine.numel()
        return (ch, S, gathered), call.issue(exchange.all_gather, gathered, mine)

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
            op.values, op.message_bytes = world * S, gathered.numel()
        return None, None

    _pipeline(call.chunks(flat.numel(), world * config.block), (quantize, reduce, finish), call)


def one_shot(flat: torch.Tensor, call: Call) -> None:
    """Compressed all-reduce of the 1-D ``flat``, in place: one quantization error."""
    world, dtype = call.world, flat.dtype

    def finish(state):
        ch, gathered = state
        with call.rec.codec("dequantize") as op:
            vals = ops.dequantize_reduce(gathered.view(world, -1), ch.numel, call.config, dtype, requantize=False)
            op.values, op.message_bytes = ch.numel, gathered.numel()
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
            op.values, op.message_bytes = world * ch.numel, gathered.numel()
        return None, None

    _pipeline(call.chunks(src.numel(), call.config.block), (_quantize_gather(src, call), finish), call)


def scatter(src: torch.Tensor, out: torch.Tensor, call: Call) -> None:
    """Compressed reduce-scatter of ``src`` (world, n) into ``out`` (n,), chunked along n.
    Row j's value i draws counter offset(j * padded(n) + i) whatever the chunking: one
    quantize_rows of all rows for one chunk (its rows' counters follow each other), one per
    row for a chunk of a longer row."""
    world, rec, config, dtype = call.world, call.rec, call.config, out.dtype
    n = out.numel()
    row_stride = layout(n, config).padded
    seed = call.streams.seed

    def quantize(ch: plan.Chunk):
        rows = src[:, ch.start : ch.start + ch.numel]
        with rec.codec("quantize") as op:
            if ch.numel == n or config.rounding != "stochastic":  # (round-to-nearest draws nothing)
                msgs = ops.quantize_rows(rows.contiguous(), config, seed, call.streams.offset(0))
            else:
                msgs = torch.cat([ops.quantize_rows(rows[j : j + 1], config, seed,
                                                    call.streams.offset(j * row_stride + ch.start))
                                  for j in range(world)])
            op.values, op.message_bytes = rows.numel(), msgs.numel()
        recv = torch.empty_like(msgs) if world > 1 else msgs
        rec.bytes_sent += (world - 1) * msgs.shape[1]
        return (ch, recv), call.issue(exchange.all_to_all, recv, msgs)

    def finish(state):
        ch, recv = state
        with rec.codec("dequantize") as op:
            vals = ops.dequantize_reduce(recv, ch.numel, config, dtype, requantize=False)
            op.values, op.message_bytes = ch.numel, recv.numel()
        out[ch.start : ch.start + ch.numel].copy_(vals)
        return None, None

    _pipeline(call.chunks(out.numel(), config.block), (quantize, finish), call)


def _issue_among(call: Call, fn: Callable[..., Any], peers: list[int], intra_node: bool, *args: Any) -> Any:
    """Start an asynchronous exchange among ``peers`` (group ranks; None with one peer)."""
    if len(peers) == 1:
        return None
    with call.rec.comm():
        call.rec.wire(len(peers) - 1, intra_node=intra_node)
        return fn(*args, group=call.group, async_op=True, peers=peers)


def hierarchical(flat: torch.Tensor, call: Call, layout: NodeLayout) -> None:
    """All-reduce of the 1-D ``flat`` over the nodes of ``layout``, in place: a reduce-scatter
    inside each node in the tensor's dtype, the two-shot between the nodes among each rail
    (the ranks of one local index) on its node-shard, compressed if the wire is, and an
    all-gather inside the node -- of the decoded values, or with ``intra_wire="compressed"``
    of the rail's messages themselves (no further error: every rank decodes the same bytes).

    Layout: the zero-padded tensor is (L node-shards, N inter-shards, S values); rank (node
    n, local index l) reduces node-shard l inside its node and inter-shard n of it between
    the nodes.  Bands of the S columns are the pipeline's chunks.  Stochastic rounding: each
    rail draws under its own seed (derive(seed, l)), with the flat two-shot's counters on its
    node-shard, so chunking changes no bit."""
    rank, dtype, compressed = call.rank, flat.dtype, call.wire.kind == "compressed"
    config = call.config if compressed else None
    node, rail = layout.node_peers(rank), layout.rail_peers(rank)
    L, N, l, n = len(node), len(rail), node.index(rank), rail.index(rank)
    block = config.block if compressed else 1
    T = flat.numel()
    S = plan.shard_values(-(-T // L), N, block)
    padded = flat if T == L * N * S else torch.cat([flat, flat.new_zeros(L * N * S - T)])
    view = padded.view(L, N, S)
    forward_messages = compressed and call.options.intra_wire == "compressed"
    seed = derive(call.streams.seed, l) if compressed else 0
    stochastic = compressed and config.rounding == "stochastic"
    rec, item = call.rec, flat.element_size()
    band_values = None if call.chunk_values is None else max(block, call.chunk_values // (L * N))

    def reduce_scatter(band: plan.Chunk):
        send = view[:, :, band.start : band.start + band.numel].reshape(L, -1).contiguous()
        recv = torch.empty_like(send) if L > 1 else send
        rec.bytes_sent += (L - 1) * send.shape[1] * item
        return (band, recv), _issue_among(call, exchange.all_to_all, node, True, recv, send)

    def inter_send(state):
        band, recv = state
        b, w = band.start, band.numel
        part = recv[0].float() if L > 1 else recv[0].float().clone()
        for j in range(1, L):  # in local-index order: every rail peer sums alike
            part += recv[j]
        part = part.view(N, w)
        if compressed:
            with rec.codec("quantize") as op:
                if stochastic and w < S:  # each row at its one-band counters
                    send = torch.cat([ops.quantize_rows(part[q : q + 1], config, seed,
                                                        CallStreams(seed, n).offset(q * S + b)) for q in range(N)])
                else:
                    send = ops.quantize_rows(part, config, seed, CallStreams(seed, n).offset(b))
                op.values, op.message_bytes = N * w, send.numel()
        else:
            send = part.to(dtype)
        recv2 = torch.empty_like(send) if N > 1 else send
        rec.bytes_sent += (N - 1) * send[0].numel() * send.element_size()
        return (band, recv2), _issue_among(call, exchange.all_to_all, rail, False, recv2, send)

    def inter_reduce(state):
        band, recv2 = state
        b, w = band.start, band.numel
        if compressed:
            with rec.codec("dequantize") as op:
                mine = ops.dequantize_reduce(recv2, w, config, dtype, requantize=True, seed=seed,
                                             offset=CallStreams.offset_requant(n * S + b, S))
                op.values, op.message_bytes = 0, recv2.numel() + mine.numel()
        else:
            total = recv2[0].float() if N > 1 else recv2[0].float().clone()
            for q in range(1, N):
                total += recv2[q]
            mine = total.to(dtype)
        gathered = mine.new_empty((N, mine.numel())) if N > 1 else mine.view(1, -1)
        rec.bytes_sent += (N - 1) * mine.numel() * mine.element_size()
        return (band, gathered), _issue_among(call, exchange.all_gather, rail, False, gathered, mine.view(-1))

    def intra_gather(state):
        band, gathered = state
        w = band.numel
        if forward_messages:
            mine = gathered.reshape(-1)
        elif compressed:
            with rec.codec("dequantize") as op:  # the rail's node-shard, decoded: the same bits on every rail peer
                mine = ops.dequantize_rows(gathered.view(N, -1), w, config, dtype, saturate=L * N == 1).reshape(-1)
                op.values, op.message_bytes = N * w, gathered.numel()
        else:
            mine = gathered.reshape(-1)
        out = mine.new_empty((L, mine.numel())) if L > 1 else mine.view(1, -1)
        rec.bytes_sent += (L - 1) * mine.numel() * mine.element_size()
        return (band, out), _issue_among(call, exchange.all_gather, node, True, out, mine)

    def write(state):
        band, out = state
        b, w = band.start, band.numel
        if forward_messages:
            with rec.codec("dequantize") as op:
                vals = ops.dequantize_rows(out.view(L * N, -1), w, config, dtype, saturate=L * N == 1)
                op.values, op.message_bytes = L * N * w, out.numel()
        else:
            vals = out
        view[:, :, b : b + w].copy_(vals.view(L, N, w))
        return None, None

    _pipeline(plan.chunks(S, block, band_values), (reduce_scatter, inter_send, inter_reduce, intra_gather, write), call)
    if padded is not flat:
        flat.copy_(padded[:T])
