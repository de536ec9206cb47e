"""Time dilation of the emulated cluster: what the link shaping cannot do, as collective hooks.

The emulated cluster slows its link by ``time_dilation`` (target FLOP/s / a rank's FLOP/s)
so that compute : bandwidth matches the target cluster.  Two other components must be
slowed by the same factor, and tc cannot do it here:

latency_s         the dilated per-hop latency: slept before each wire step of a collective
                  (a ring all-reduce and the two-shot take 2 (W-1) steps, an all-gather,
                  an all-to-all and a reduce-scatter W-1), counted as communication time
codec_bytes_per_s the dilated target codec's throughput (codec fraction x target HBM bytes/s
                  / time_dilation): each codec op lasts at least the bytes the target's op
                  moves (its values at TARGET_VALUE_BYTES, the messages' own bytes) over it --
                  the remainder is slept after the op, counted as codec time; an op already
                  slower is left as it is and counted as not stretched

A ``Dilation`` is a fp4quant.comm hooks object (``on_wire``, ``on_codec``): the cluster's rank
wrapper (fp4quant.cluster.rank) installs it in each rank before the job runs; the
collectives know nothing of it.  It changes time only, never a value.  The sleeps block
the host: a pipelined collective's codec does not overlap them (the emulated cluster runs
on CPU, where the ops are synchronous anyway).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

TARGET_VALUE_BYTES = 2  # the target trains in BF16: a value read or written by its codec is 2 bytes


@dataclass
class Dilation:
    """What a rank stretches besides the link (the defaults: nothing), and what it slept."""

    latency_s: float = 0.0  # slept per wire step of a collective; 0: none
    codec_bytes_per_s: float = 0.0  # dilated target codec bytes/s; 0: the codec is not stretched
    slept: dict = field(default_factory=lambda: {"wire_steps": 0, "codec_stretch_s": 0.0, "codec_unstretched": 0})

    def __post_init__(self) -> None:
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"dilation latency_s must be a finite number >= 0 seconds, got {self.latency_s!r}")
        if not (isinstance(self.codec_bytes_per_s, (int, float)) and math.isfinite(self.codec_bytes_per_s)
                and self.codec_bytes_per_s >= 0):
            raise ValueError(f"dilation codec_bytes_per_s must be a finite number >= 0 (0: off), "
                             f"got {self.codec_bytes_per_s!r}")

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.codec_bytes_per_s > 0

    # ---- the hooks (fp4quant.comm.hooks) -----------------------------------------------

    def on_wire(self, steps: int, intra_node: bool = False) -> None:
        """Sleep the latency of ``steps`` wire steps between nodes (nothing without a latency;
        steps inside a node cross its loopback, not the shaped link)."""
        if self.latency_s > 0 and steps > 0 and not intra_node:
            self.slept["wire_steps"] += steps
            self.sleep(steps * self.latency_s)

    def on_codec(self, op: str, seconds: float, values: int, message_bytes: int) -> None:
        """Sleep until the op has lasted the dilated target codec's time for what it handled."""
        target = self.codec_target_s(TARGET_VALUE_BYTES * values + message_bytes)
        if target > seconds:
            self.sleep(target - seconds)
            self.slept["codec_stretch_s"] += target - seconds
        elif target > 0:
            self.slept["codec_unstretched"] += 1

    def describe(self) -> dict:
        return {"kind": "emulated cluster time dilation", **self.to_dict(), **self.slept}

    # ---------------------------------------------------------------------------------------

    @staticmethod
    def sleep(seconds: float) -> None:
        """Every sleep of the dilation goes through here (tests count them)."""
        time.sleep(seconds)

    def codec_target_s(self, bytes_moved: int) -> float:
        """Seconds the dilated target codec takes to move ``bytes_moved`` (0: not stretched)."""
        return bytes_moved / self.codec_bytes_per_s if self.codec_bytes_per_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "codec_bytes_per_s": self.codec_bytes_per_s,
                "target_value_bytes": TARGET_VALUE_BYTES}
