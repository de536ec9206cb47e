"""The random streams of stochastic rounding, owned by whoever makes the calls.

A ``RandomStreams`` belongs to one caller (a TPCommunicator, a benchmark, a test): it has
a base seed, an optional step key, and a counter of the compressed calls made since the
key was set.  Compressed call ``n`` after ``start_step(s)`` gets the seed

    derive(derive(seed, s), n)        (without a step key: derive(seed, n))

where ``derive(a, b) = mix64(a ^ mix64(b + golden))`` is the one seed-mixing function of
the package.  So streams differ across calls and steps, and a rerun or a resumed run
(which sets the same step keys) replays them bit for bit; nothing outside the object
advances its counter.  Only compressed calls take a stream (exact and cast wires, and
empty tensors, draw nothing), so the n-th compressed call is the same on every rank of
a group, which calls its collectives in the same order.

Within a call, every draw is keyed by the position of its value in the whole call, never
by how the call is chunked (fp4quant.comm.plan), so chunking changes no bit of a
block-local config's result.  Rank r quantizes the value at position p (of the flat tensor,
zero-padded) with counter ``(r << 48) + p``; in a reduce-scatter, row j's value i is at
``p = j * padded(n) + i``.  The two-shot re-quantizes position p with
``(o << 48) + (1 << 47) + (p - o * S)``, where S is the one-chunk shard size and
o = p // S the rank that reduces p when the call is one chunk (offset_requant): with one
chunk this is ``(r << 48) + (1 << 47)`` plus the position in rank r's shard, the layout of
the committed runs.  Streams therefore differ across ranks, phases and values as long as a
tensor has fewer than 2**47 values.
"""

from __future__ import annotations

from dataclasses import dataclass

RANK_SHIFT = 48
REQUANT_BIT = 1 << 47
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: splitmix64's increment


def mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit words."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive(base: int, index: int) -> int:
    """The ``index``-th seed under ``base`` (steps under a run seed, calls under a step)."""
    return mix64(base ^ mix64(index + GOLDEN))


@dataclass(frozen=True)
class CallStreams:
    """Seed and counter offsets of one collective call on one rank."""

    seed: int
    rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < 1 << (64 - RANK_SHIFT - 1):
            raise ValueError(f"rank {self.rank} too large for the stochastic-rounding counter layout")

    def offset(self, start: int, requant: bool = False) -> int:
        return (self.rank << RANK_SHIFT) + (REQUANT_BIT if requant else 0) + start

    @staticmethod
    def offset_requant(position: int, shard: int) -> int:
        """Counter of the two-shot's re-quantization of the value at ``position`` of the padded
        flat tensor, whose one-chunk shards hold ``shard`` values: that of the rank reducing it
        in a one-chunk call, whichever rank reduces it in a chunked one.  Consecutive positions
        get consecutive counters up to the next multiple of ``shard`` (see plan.owner_runs)."""
        owner = position // shard
        return (owner << RANK_SHIFT) + REQUANT_BIT + position - owner * shard


class RandomStreams:
    """A seed, a step key and a call counter: the streams of one caller's compressed calls."""

    __slots__ = ("seed", "step", "calls")

    def __init__(self, seed: int = 0) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = seed
        self.step: int | None = None
        self.calls = 0

    def start_step(self, step: int) -> None:
        """Key the streams by ``step`` and restart the call counter: a resumed run that sets
        the same steps replays exactly the streams it would have had."""
        self.step, self.calls = step, 0

    def next(self, rank: int) -> CallStreams:
        """The streams of the next compressed call (advances the counter)."""
        base = self.seed if self.step is None else derive(self.seed, self.step)
        call = CallStreams(derive(base, self.calls), rank)
        self.calls += 1
        return call

    def __repr__(self) -> str:
        return f"RandomStreams(seed={self.seed}, step={self.step}, calls={self.calls})"
