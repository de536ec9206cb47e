"""Options: what a collective does besides its tensors and its group, as one frozen value.

A caller that sends many collectives the same way (a TPCommunicator, one per direction)
builds one Options and passes it to every call; the functional API builds one from its
keyword arguments.  It travels unchanged into the algorithm (``algorithms.Call.options``),
and its fields are what cross-rank validation compares.

wire         what crosses the wire: a Wire, a QuantConfig, a preset name, "exact" or None
             (``Wire.of``; resolved when a call is prepared, where a bad one is reported)
algorithm    "two_shot", "one_shot", "hierarchical" or "auto" (all_reduce's; see
             fp4quant.comm.all_reduce)
chunk_bytes  pipeline chunks of this many input bytes; None: one chunk; "auto": the
             measured policy of plan.default_chunk_bytes
overlap      False: each chunk through all its stages before the next (the benchmark's control)
validate     check the call across ranks first (fp4quant.comm.validate)
sync_timing  on CUDA, synchronize around timed steps so the counters hold GPU durations
stats_key    the key the call is counted under in fp4quant.comm.stats()
ranks_per_node  the hierarchical all-reduce's node layout: that many consecutive group ranks
             a node; None: torchrun's LOCAL_WORLD_SIZE (fp4quant.comm.layout)
intra_wire   the hierarchical all-reduce's all-gather inside a node: "exact" (decoded values
             in the tensor's dtype) or "compressed" (the inter-node messages themselves)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Options:
    wire: Any = None  # a Wire or what Wire.of makes one of
    algorithm: str = "two_shot"
    chunk_bytes: int | str | None = "auto"
    overlap: bool = True
    validate: bool = False
    sync_timing: bool = False
    stats_key: str = "other"
    ranks_per_node: int | None = None
    intra_wire: str = "exact"

    def record(self) -> dict[str, Any]:
        """The fields that decide a call's messages and their order (validation compares them)."""
        return {"algorithm": self.algorithm, "chunk_bytes": self.chunk_bytes, "overlap": self.overlap,
                "ranks_per_node": self.ranks_per_node, "intra_wire": self.intra_wire}
