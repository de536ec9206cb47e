"""Compressed collectives over torch.distributed: the tensors cross the wire as FP4.

    import fp4quant.comm as comm
    comm.all_reduce(x, "fp4quant", group=tp_group)              # in place, two-shot
    comm.all_reduce(x, "fp4quant", algorithm="one_shot", op="avg")
    comm.all_gather(out, x, "fp4quant", group=tp_group)         # out: W * x.numel() values
    comm.reduce_scatter(out, x, "fp4quant", group=tp_group)     # x: W * out.numel() values
    streams = comm.RandomStreams(seed)                          # stochastic rounding: the caller's streams
    comm.all_reduce(x, sr_config, streams=streams, stats_key="bwd")
    comm.stats(); comm.traffic(); comm.reset_stats(); comm.take_spans()
    opts = comm.Options("fp4quant", stats_key="fwd")             # one options value, built once
    comm.all_reduce(x, group=tp_group, options=opts)

``config`` is a Wire (exact, cast to bf16, or compressed) or what ``Wire.of`` makes one
of: ``None`` or the ``bf16`` preset is the plain uncompressed collective (exactly torch's
result).  Works on gloo (CPU) and NCCL (CUDA), any world size, any number of
values (empty included), float32 / bfloat16 / float16, contiguous or not; every rank
ends with bit-identical results; NaN or Inf in a rank's input becomes NaN in the same
micro-group (with the FWHT: the same FWHT group) on every rank.

Modules: collectives (public API), options (what a call does besides its tensors), wire
(what crosses the wire), streams (random streams of stochastic rounding, owned by the
caller), algorithms (the Call and two-shot, one-shot, gather, scatter as chunked
pipelines), exchange (their all-to-all and all-gather: full duplex on gloo), plan
(sharding, padding, chunking), auto (algorithm selection from the benchmark's
thresholds), validate (argument checks and cross-rank validation), counters (stats()),
hooks (the one seam: called around wire steps and codec ops; none by default).  Benchmark:
``torchrun --standalone --nproc-per-node 2 -m fp4quant.bench.allreduce_sweep``.
"""

from __future__ import annotations

from . import hooks
from .auto import Thresholds, set_table
from .collectives import DEFAULT_CHUNK_BYTES, all_gather, all_reduce, reduce_scatter
from .counters import reset_stats, stats, take_spans, traffic
from .options import Options
from .plan import default_chunk_bytes
from .streams import RandomStreams, derive, mix64
from .validate import ALGORITHMS, OPS
from .wire import Wire

__all__ = [
    "ALGORITHMS",
    "DEFAULT_CHUNK_BYTES",
    "OPS",
    "Options",
    "RandomStreams",
    "Thresholds",
    "Wire",
    "all_gather",
    "all_reduce",
    "default_chunk_bytes",
    "derive",
    "hooks",
    "mix64",
    "reduce_scatter",
    "reset_stats",
    "set_table",
    "stats",
    "traffic",
    "take_spans",
]
