"""Argument checks of the collectives, and the optional cross-rank validation.

Local checks (a non-float tensor, a bad ``op`` or ``algorithm``, inconsistent shapes,
stochastic rounding without the caller's random streams) raise before any
communication.  With validation on (``validate=True``) the ranks first exchange a small record
of everything that decides the call's messages and their order (collective, shapes, dtype,
device type, config, op, algorithm, chunking, overlap, and any local argument error);
then every rank raises the same ``ValueError`` naming the first rank (in group order) that
differs from rank 0 and the field where it differs; a rank whose own arguments were bad
raises its own error (``TypeError`` for a bad dtype) and the others a ``ValueError``
naming it, so a mistake on one rank never leaves the others hanging.

The records travel through the process group's key-value store, not a collective: a rank
that validates waits at most ``VALIDATION_TIMEOUT_S`` for the others' records, then raises
naming the ranks that never sent one (``validate`` passed on some ranks only), where a
collective would wait for the group's own timeout (gloo's: 30 minutes).  Without
validation the fast path adds nothing.
"""

from __future__ import annotations

import json
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..format.config import QuantConfig
from ..format.packed import FLOAT_DTYPES
from .local import is_local
from .streams import RandomStreams
from .wire import Wire

OPS = ("sum", "avg", "max")  # max: uncompressed all_reduce only
ALGORITHMS = ("two_shot", "one_shot", "hierarchical", "auto")  # the one list: the trainer, the schema and the workflow read it
# how long a validating rank waits for the others' records: ranks reach a collective seconds
# apart, not minutes, even at a run's first step
VALIDATION_TIMEOUT_S = 300.0
STORE_PREFIX = "fp4quant/validate"


def check_streams(wire: Wire, streams: RandomStreams | None) -> None:
    if streams is not None and not isinstance(streams, RandomStreams):
        raise TypeError(f"streams must be a fp4quant.comm.RandomStreams, got {type(streams).__name__}")
    if streams is None and wire.kind == "compressed" and wire.config.rounding == "stochastic":
        raise ValueError("stochastic rounding needs the caller's random streams: pass streams=RandomStreams(seed)")


def resolve_op(op: Any) -> str:
    for name, reduce_op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
        if op == reduce_op:
            return name
    if isinstance(op, str) and op.lower() in OPS:
        return op.lower()
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def check_tensor(t: Any, what: str, compressed: bool) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if compressed and t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16 for a compressed collective, got {t.dtype}")
    if not compressed and not t.dtype.is_floating_point:
        raise TypeError(f"{what} must be a floating-point tensor, got {t.dtype}")


def check_algorithm(algorithm: Any) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


INTRA_WIRES = ("exact", "compressed")


def check_intra_wire(intra_wire: Any) -> None:
    if intra_wire not in INTRA_WIRES:
        raise ValueError(f"intra_wire must be one of {INTRA_WIRES}, got {intra_wire!r}")


def check_chunk_bytes(chunk_bytes: Any) -> None:
    if chunk_bytes is None or chunk_bytes == "auto":
        return
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be None, 'auto' or a positive int, got {chunk_bytes!r}")


def record(collective: str, config: QuantConfig | None, **fields: Any) -> dict[str, Any]:
    """What every rank must agree on, as plain picklable values."""
    rec: dict[str, Any] = {"collective": collective}
    for k, v in fields.items():
        if isinstance(v, torch.Tensor):
            rec[f"{k}.shape"] = tuple(v.shape)
            rec[f"{k}.dtype"] = str(v.dtype)
            rec[f"{k}.device"] = v.device.type
        else:
            rec[k] = v
    rec["config"] = None if config is None else config.to_dict()
    return rec


def _difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first field where record ``b`` differs from record ``a``, as text."""
    for key in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if key == "config" and isinstance(va, dict) and isinstance(vb, dict):
            for f in va:
                if va[f] != vb.get(f):
                    return f"config.{f}: {vb.get(f)!r} (rank 0: {va[f]!r})"
        return f"{key}: {vb!r} (rank 0: {va!r})"
    return None


class _Sequence:
    """The number of this process's validated calls on each group: the ranks' n-th validated
    calls meet under one key (every rank validates the same calls, or the wait names who did not)."""

    def __init__(self) -> None:
        self.counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def next(self, group: dist.ProcessGroup) -> int:
        n = self.counts.get(group, 0)
        self.counts[group] = n + 1
        return n


SEQUENCE = _Sequence()


def exchange(group: dist.ProcessGroup | None, rec: dict[str, Any], error: Exception | None) -> None:
    """All ranks of ``group`` compare their records; raise the same error on every rank
    when they disagree or when any rank's arguments were bad."""
    name = rec["collective"]
    mine = dict(rec, error=None if error is None else (type(error).__name__, str(error)))
    if is_local(group):  # simulated ranks: the records meet in memory
        _compare(name, group.all_gather_object(mine), error, lambda r: f"rank {r}")
        return
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    pg = group if group is not None else dist.group.WORLD
    n = SEQUENCE.next(pg)
    store = dist.PrefixStore(f"{STORE_PREFIX}/{pg.group_name}/", dist.distributed_c10d._get_default_store())
    # JSON, not pickle: tuples arrive as lists on every rank alike, and nothing received is executed
    store.set(f"{n}/{rank}", json.dumps(mine))
    keys = [f"{n}/{r}" for r in range(world)]

    def rank_name(r: int) -> str:
        g = r if group is None else dist.get_global_rank(group, r)
        return f"rank {r}" + (f" (global rank {g})" if g != r else "")

    try:
        store.wait(keys, timedelta(seconds=VALIDATION_TIMEOUT_S))
    except dist.DistStoreError:
        missing = [rank_name(r) for r, k in enumerate(keys) if not store.check([k])]
        raise ValueError(f"fp4quant.comm.{name}: validation waited {VALIDATION_TIMEOUT_S:g} s for {', '.join(missing)}, "
                         f"which did not validate this call (pass validate=True on every rank of the group, for the "
                         f"same calls)") from None
    records = [json.loads(store.get(k)) for k in keys]
    if n >= 2:  # every rank has read call n-2's records: each wrote call n-1's after reading them
        store.delete_key(f"{n - 2}/{rank}")
    _compare(name, records, error, rank_name)


def _compare(name: str, records: list[dict], error: Exception | None, rank_name) -> None:
    for r, other in enumerate(records):
        if other["error"] is not None:
            if error is not None:
                raise error
            kind, msg = other["error"]
            raise ValueError(f"fp4quant.comm.{name}: {rank_name(r)} rejected its arguments ({kind}: {msg})")
    for r, other in enumerate(records[1:], start=1):
        other = {k: v for k, v in other.items() if k != "error"}
        first = {k: v for k, v in records[0].items() if k != "error"}
        diff = _difference(first, other)
        if diff is not None:
            raise ValueError(f"fp4quant.comm.{name}: {rank_name(r)} differs from rank 0 in {diff}")
