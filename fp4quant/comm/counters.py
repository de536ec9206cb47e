"""Counters of the compressed collectives: bytes on the wire, calls, codec and communication time.

``stats()`` returns a plain dict ``{stats_key: {field: value}}``; the trainer logs it,
``reset_stats()`` clears it.  Fields, per key (``"fwd"``, ``"bwd"``, ``"other"``...):

calls               collective calls (every call, compressed or not, empty ones included)
bytes_sent          bytes this rank pushed on the wire, counted per algorithm as an ideal
                    implementation sends them: all-to-all and all-gather send (W-1) of
                    the W messages (own message or shard, to or through the W-1 peers),
                    a ring all-reduce 2 (W-1)/W of the tensor, a ring reduce-scatter
                    (W-1)/W of its input.  Metadata exchanged by validation is not counted.
bytes_uncompressed  what the uncompressed collective of the same tensor (same dtype) would
                    have sent by the same rule: 2 (W-1)/W N b for an all-reduce, (W-1) N b
                    for an all-gather of N values per rank, (W-1)/W N b for a reduce-scatter
                    of an N-value input (b: bytes per value of the tensor's dtype)
codec_s             seconds in the codec ops (quantize, dequantize-reduce, dequantize):
                    quantize_s + dequantize_s
quantize_s          seconds in the quantize ops (quantize_rows: the first encoding)
dequantize_s        seconds in the decoding ops (dequantize_reduce, which re-quantizes the
                    reduced shard in the two-shot, and dequantize_rows)
comm_s              seconds in the collectives: issuing them, and waiting for them; with
                    chunked pipelining, only the part not hidden behind the codec
total_s             seconds of the whole call (includes padding and copies)
wire_steps          wire steps of the collectives (a ring all-reduce or the two-shot
                    2 (W-1), an all-gather, all-to-all or reduce-scatter W-1)

spans (``take_spans()``, not in ``stats()``): each timed part of ``comm_s`` as its
                    (start, end) on ``time.perf_counter``'s clock, in order, per key, kept
                    from the first ``take_spans()`` on (never for callers that do not take
                    them, whose lists would only grow): ranks on one host share that
                    clock, so the step's time from the last rank's arrival at each part
                    to the last rank's leaving it can be computed (fp4quant.train's
                    comm_link_s)

Time is host wall-clock (``time.perf_counter``).  On CPU the ops are synchronous, so it
is what each step costs.  On CUDA the ops are asynchronous: without ``sync_timing=True``
(a field of the caller's options) the times are the host time to launch the kernels and
collectives, not their GPU duration; with it, every timed step ends with a
``torch.cuda.synchronize()`` (exact, but it serializes the pipeline).  The fast path
never synchronizes.

The totals are the calling thread's (a simulated rank's are its own: fp4quant.comm.local),
keyed by the ``stats_key`` each call names (a TPCommunicator maps its directions to "fwd"
and "bwd"); nothing else is shared.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from . import hooks as _hooks

FIELDS = ("calls", "bytes_sent", "bytes_uncompressed", "codec_s", "quantize_s", "dequantize_s", "comm_s", "total_s",
          "wire_steps")
COUNTS = ("calls", "bytes_sent", "bytes_uncompressed", "wire_steps")
CODEC_OPS = ("quantize", "dequantize")  # the two codec timers: Recorder.codec(op)


def _new() -> dict[str, float]:
    return {f: 0 if f in COUNTS else 0.0 for f in FIELDS}


class _Counters(threading.local):
    """One thread's totals and spans (each thread starts with empty ones)."""

    def __init__(self) -> None:
        self.stats: defaultdict[str, dict[str, float]] = defaultdict(_new)
        self.spans: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
        self.keep_spans = False  # set by the first take_spans()


_COUNTERS = _Counters()


def stats() -> dict[str, dict[str, Any]]:
    """A copy of the counters: ``{stats_key: {calls, bytes_sent, bytes_uncompressed, codec_s,
    quantize_s, dequantize_s, comm_s, total_s, wire_steps}}`` (see the module doc for what each
    counts)."""
    return copy.deepcopy(dict(_COUNTERS.stats))


def traffic(keys: tuple[str, ...] = ("fwd", "bwd")) -> dict[str, dict[str, int]]:
    """Calls and bytes (sent, uncompressed) per stats key, 0 where a key has none: what a
    training script reports of its TP traffic."""
    return {k: {f: int(_COUNTERS.stats.get(k, {}).get(f, 0)) for f in ("calls", "bytes_sent", "bytes_uncompressed")}
            for k in keys}


def reset_stats() -> None:
    """Clear all counters (the spans included)."""
    _COUNTERS.stats.clear()
    _COUNTERS.spans.clear()


def take_spans() -> dict[str, list[tuple[float, float]]]:
    """The (start, end) of every timed part of comm_s since the last take (or reset), per
    key, in the order they ran; they are cleared (a caller takes them once a step).  The
    first call starts keeping them (and returns {})."""
    _COUNTERS.keep_spans = True
    spans = dict(_COUNTERS.spans)
    _COUNTERS.spans.clear()
    return spans


class CodecOp:
    """What one codec op handled, set by its caller: told to the installed hooks on exit."""

    __slots__ = ("values", "message_bytes")

    def __init__(self) -> None:
        self.values = 0  # values encoded or decoded
        self.message_bytes = 0  # bytes of messages written or read


class Recorder:
    """Accumulates one call's counters; ``commit()`` adds them to the totals of ``key``.  The
    hooks installed when the call starts (fp4quant.comm.hooks) see its wire steps and codec ops."""

    __slots__ = ("key", "cuda", "hooks", "bytes_sent", "bytes_uncompressed", "quantize_s", "dequantize_s", "comm_s",
                 "start", "spans", "wire_steps")

    def __init__(self, key: str, device: torch.device, sync_timing: bool = False) -> None:
        self.key = key
        self.cuda = device.type == "cuda" and sync_timing
        self.hooks = _hooks.installed()
        self.bytes_sent = 0
        self.bytes_uncompressed = 0
        self.quantize_s = 0.0
        self.dequantize_s = 0.0
        self.comm_s = 0.0
        self.wire_steps = 0
        self.spans: list[tuple[float, float]] = []
        self.start = time.perf_counter()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def codec(self, op_name: str) -> Iterator[CodecOp]:
        """Time a codec op: ``op_name`` "quantize" (the first encoding) or "dequantize"
        (decoding, dequantize-reduce with its re-quantization included).  The caller sets what
        the op handled on the yielded CodecOp; the hooks' time after it counts as the op's."""
        if op_name not in CODEC_OPS:
            raise ValueError(f"codec op must be one of {CODEC_OPS}, got {op_name!r}")
        t = self._now()
        op = CodecOp()
        yield op
        elapsed = self._now() - t
        if self.hooks is not None:
            self.hooks.on_codec(op_name, elapsed, op.values, op.message_bytes)
            elapsed = self._now() - t
        if op_name == "quantize":
            self.quantize_s += elapsed
        else:
            self.dequantize_s += elapsed

    def wire(self, steps: int, intra_node: bool = False) -> None:
        """Count ``steps`` wire steps of a collective about to be issued, and tell the hooks
        (call inside ``comm()``: their time is communication); ``intra_node``: steps known
        to stay inside a node (the hierarchical all-reduce's)."""
        self.wire_steps += steps
        if self.hooks is not None:
            self.hooks.on_wire(steps, intra_node)

    @contextmanager
    def comm(self) -> Iterator[None]:
        t = self._now()
        yield
        end = self._now()
        self.comm_s += end - t
        if _COUNTERS.keep_spans:  # nothing to append for callers that never take them
            self.spans.append((t, end))

    def commit(self) -> None:
        s = _COUNTERS.stats[self.key]
        s["calls"] += 1
        s["bytes_sent"] += int(self.bytes_sent)
        s["bytes_uncompressed"] += int(self.bytes_uncompressed)
        s["codec_s"] += self.quantize_s + self.dequantize_s
        s["quantize_s"] += self.quantize_s
        s["dequantize_s"] += self.dequantize_s
        s["comm_s"] += self.comm_s
        s["total_s"] += time.perf_counter() - self.start
        s["wire_steps"] += self.wire_steps
        if self.spans:
            _COUNTERS.spans[self.key].extend(self.spans)
