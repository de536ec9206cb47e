"""An alpha-beta model of one tensor-parallel training step.

    step = compute + scalar all-reduces + skew + sum over TP all-reduces of (communication + codec)

compute        training FLOPs of one rank's shard (ModelConfig.flops_per_token / tp) over
               the rank's sustained FLOP/s
all-reduces    two per layer in each direction (after o_proj and down_proj forward, before
               q/k/v and gate/up backward) plus one each way at the embedding / lm_head;
               each carries tokens x hidden values
communication  ring / two-shot: each rank sends and receives 2 (W-1)/W of the message in
               2 (W-1) steps: 2 (W-1)/W x bytes / bandwidth + 2 (W-1) x latency, with the
               inter-node link's figures when the TP group spans nodes, else the node's
codec          quantize the message (N values), dequantize-reduce the W received messages
               into this rank's shard (N / W values out), dequantize the W gathered shards
               (N values), at the measured (or assumed) values per second of each, per
               direction: backward traffic is stochastically rounded, and where the machine
               has rates for "<preset>:sr" those are used for it
scalar         the trainer's uncompressed scalar all-reduces (vocab-parallel cross-entropy's
               three, the gradient norm, the non-finite check): Workload.scalar_allreduces
               per step, each allreduce_time(8 bytes) or the machine's measured time
skew           ranks in lockstep wait for the slowest at every collective: Machine.skew_s per
               step (0 on dedicated hardware; measured on the emulated cluster's shared cores)
overlap        off (default): TP communication is blocking, as in Megatron-style TP and in
               this project's trainer.  On: the wire time hides behind the step's compute as
               far as that lasts (exposed = max(0, communication - compute)); the codec stays
               on the critical path (it runs on the same cores / SMs as the compute).  An upper
               bound on what overlapping schemes (async TP, chunked matmul pipelining) gain.

A token-bucket link (the emulated cluster's tc shaping) accrues credit while idle, up to its
depth (``burst_bytes``), and a transfer's bytes covered by credit go at line rate.  An
all-reduce sends in two phases (two-shot: all-to-all, then all-gather; a ring:
reduce-scatter, then all-gather), each (W-1)/W of the message.  The model follows the bucket
through a direction's all-reduces one after another (shaped_allreduces): it refills during
the compute between them (forward compute is FORWARD_SHARE of it, 2 of the 6 FLOPs per
parameter and token, spread over that direction's all-reduces), the quantization, each
phase's latency and the dequantize-reduce between the phases; what a phase does not spend is
left for the next (a compressed message smaller than the bucket mostly rides on it).  Each
direction starts with a full bucket: the loss and the optimizer step before it last longer
than the bucket takes to fill.
``burst_bytes`` is 0 for real links.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..format.config import QuantConfig
from ..models.model_config import ModelConfig


@dataclass(frozen=True)
class Machine:
    """What one TP rank computes and communicates with."""

    name: str
    rank_flops: float  # sustained training FLOP/s
    inter_bw: float  # bytes/s, bus bandwidth of the inter-node link (per rank)
    inter_latency: float  # seconds per collective step across nodes
    intra_bw: float  # bytes/s inside a node
    intra_latency: float
    ranks_per_node: int
    codec_values_per_s: dict[str, dict[str, float]] = field(default_factory=dict)  # preset -> op -> values/s
    wire_bytes_uncompressed: float = 2.0  # BF16 on the wire
    burst_bytes: float = 0.0  # token-bucket depth of a shaped link (0: a real link)
    scalar_allreduce_s: float | None = None  # measured seconds of one scalar all-reduce (None: alpha-beta)
    skew_s: float = 0.0  # per step, a rank's wait for a slower peer (load imbalance; measured by perfmodel.probe)

    def __post_init__(self):  # a NaN, zero or negative rate would give a tokens/s that looks like one
        for name in ("rank_flops", "inter_bw", "intra_bw"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"machine {self.name!r}: {name} must be positive and finite, "
                                 f"got {getattr(self, name)}")
        for name in ("inter_latency", "intra_latency", "burst_bytes", "skew_s"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"machine {self.name!r}: {name} must be at least 0 and finite, "
                                 f"got {getattr(self, name)}")
        if self.ranks_per_node < 1:
            raise ValueError(f"machine {self.name!r}: ranks_per_node must be at least 1, got {self.ranks_per_node}")


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    tp: int
    seq_len: int
    batch_size: int  # sequences per DP rank per step
    dp: int = 1
    scalar_allreduces: int = 5  # fp4quant.train: 3 in the vocab-parallel loss, gradient norm, non-finite check
    # the share of each TP all-reduce's tensor sent (1: all, as the trainer; the probe's
    # in-step collectives send part of it: perfmodel.model_validation fits the latency to them)
    message_fraction: float = 1.0

    def __post_init__(self):
        for name in ("tp", "seq_len", "batch_size", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload: {name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.message_fraction <= 1:
            raise ValueError(f"message_fraction must be in (0, 1], got {self.message_fraction}")

    @property
    def tokens(self) -> int:
        return self.seq_len * self.batch_size

    @property
    def messages_per_direction(self) -> int:
        return 2 * self.model.num_layers + 1


@dataclass(frozen=True)
class Step:
    compute_s: float
    comm_s: float
    codec_s: float
    tokens_per_s: float
    wire_bytes: float  # per rank per step
    exposed_comm_s: float  # the part of comm_s on the critical path (comm_s unless overlapped)
    scalar_s: float = 0.0  # the trainer's scalar all-reduces (latency-bound, never compressed)
    skew_s: float = 0.0  # waiting for a slower peer inside the collectives
    quantize_s: float = 0.0  # codec_s split: the quantize ops ...
    dequantize_s: float = 0.0  # ... and the decoding ones (dequantize-reduce, dequantize)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.scalar_s + self.skew_s + self.exposed_comm_s + self.codec_s


FORWARD_SHARE = 1 / 3  # of a training step's FLOPs: forward 2, backward 4 per parameter and token


def allreduce_time(nbytes: float, world: int, bw: float, latency: float) -> float:
    """Ring / two-shot all-reduce of ``nbytes`` on a link without a token bucket: two phases of
    (W-1)/W x nbytes, each W-1 latencies (a shaped link: shaped_allreduces)."""
    if world == 1:
        return 0.0
    return 2 * (world - 1) / world * nbytes / bw + 2 * (world - 1) * latency


def shaped_allreduces(count: int, nbytes: float, world: int, bw: float, latency: float, burst: float,
                      before: float, between: float, after: float) -> float:
    """Seconds of ``count`` all-reduces of ``nbytes`` one after another on a token-bucket link
    of depth ``burst`` bytes, starting full, idle ``before`` each (compute and quantization),
    ``between`` its phases (dequantize-reduce) and ``after`` it (dequantize); a phase's
    latency idles the link too.  ``burst`` 0: ``count`` x allreduce_time(nbytes, ...)."""
    if world == 1:
        return 0.0
    phase = (world - 1) / world * nbytes
    phase_latency = (world - 1) * latency
    tokens, seconds = burst, 0.0
    for _ in range(count):
        for idle in (before, between):
            tokens = min(burst, tokens + bw * (idle + phase_latency))
            free = min(tokens, phase)
            tokens -= free
            seconds += (phase - free) / bw + phase_latency
        tokens = min(burst, tokens + bw * after)
    return seconds


def bytes_per_value(config: QuantConfig | None, uncompressed: float) -> float:
    return uncompressed if config is None or not config.compressed else config.bits_per_value / 8


def step(w: Workload, m: Machine, preset: str, compress: str = "both", overlap: bool = False) -> Step:
    """The modelled step of workload ``w`` on machine ``m`` with TP traffic under ``preset``
    (``overlap``: the wire time hides behind compute, see the module's docstring)."""
    compute = w.model.flops_per_token(w.seq_len) * w.tokens / w.tp / m.rank_flops
    spans_nodes = w.tp > m.ranks_per_node
    if spans_nodes and w.tp % m.ranks_per_node:
        raise ValueError(f"TP {w.tp} does not fill whole nodes of {m.ranks_per_node} ranks on {m.name!r}")
    bw, lat = (m.inter_bw, m.inter_latency) if spans_nodes else (m.intra_bw, m.intra_latency)
    values = w.tokens * w.model.hidden_size * w.message_fraction
    n = w.messages_per_direction
    comm = quant = dequant = wire = 0.0
    config = QuantConfig.preset(preset)
    for direction in ("fwd", "bwd"):
        compressed = config.compressed and compress in (direction, "both")
        per_value = bytes_per_value(config if compressed else None, m.wire_bytes_uncompressed)
        msg = values * per_value
        q = dq_reduce = dq = 0.0  # seconds per call of each codec op
        if compressed and w.tp > 1:
            rates = codec_rates(m, preset, stochastic=direction == "bwd")  # the trainer rounds backward traffic stochastically
            q, dq_reduce, dq = values / rates["quantize"], values / w.tp / rates["dequantize_reduce"], values / rates["dequantize"]
        quant += n * q
        dequant += n * (dq_reduce + dq)
        gap = compute * (FORWARD_SHARE if direction == "fwd" else 1 - FORWARD_SHARE) / n  # compute between all-reduces
        comm += shaped_allreduces(n, msg, w.tp, bw, lat, m.burst_bytes, gap + q, dq_reduce, dq)
        wire += n * 2 * (w.tp - 1) / w.tp * msg
    exposed = max(comm - compute, 0.0) if overlap else comm
    scalar = 0.0
    if w.tp > 1:
        one = m.scalar_allreduce_s if m.scalar_allreduce_s is not None else allreduce_time(8, w.tp, bw, lat)
        scalar = w.scalar_allreduces * one
    codec = quant + dequant
    skew = m.skew_s if w.tp > 1 else 0.0
    total = compute + scalar + skew + exposed + codec
    return Step(compute, comm, codec, w.dp * w.tokens / total, wire, exposed, scalar, skew, quant, dequant)


def codec_rates(m: Machine, preset: str, stochastic: bool) -> dict[str, float]:
    """values/s of each codec op: the preset's own (else fp4quant's), the stochastically
    rounded "<preset>:sr" ones for backward traffic where the machine has them."""
    table = m.codec_values_per_s
    for key in ([f"{preset}:sr"] if stochastic else []) + [preset, "fp4quant"]:
        if key in table:
            return table[key]
    raise KeyError(f"machine {m.name!r} has no codec throughput for {preset!r}")


def fit_alpha_beta(sizes: list[float], latencies: list[float], world: int) -> tuple[float, float]:
    """Least-squares (latency per step, bandwidth) of an all-reduce's measured latency vs bytes."""
    import numpy as np

    x = np.array([2 * (world - 1) / world * s for s in sizes], dtype=float)
    y = np.array(latencies, dtype=float)
    a = np.vstack([np.full_like(x, 2 * (world - 1)), x]).T
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, y, rcond=None)
    if not inv_bw > 0:  # times that do not grow with bytes (noise over too narrow a range) fix no bandwidth
        raise ValueError(f"all-reduce latencies {[f'{t:.3g}' for t in latencies]} s do not grow with message size "
                         f"{[int(s) for s in sizes]} bytes: no bandwidth fits; time larger messages or more iterations")
    return max(float(alpha), 0.0), 1.0 / float(inv_bw)


def fit_link(sizes: list[float], latencies: list[float], world: int, burst_bytes: float = 0.0) -> tuple[float, float]:
    """(latency per step, bandwidth) of a link from its measured uncompressed all-reduces, in
    the Hockney manner: the bandwidth from the slope over messages far beyond the token
    bucket's burst (at least 8 bursts on the wire), the latency from the smallest message
    when its bytes ride on the burst (so its time is all per-step overhead).

    A plain least-squares intercept (fit_alpha_beta) is ill-conditioned here: messages
    that take seconds fix a millisecond intercept to within their noise, and on the
    emulated cluster two runs 3 % apart gave 0 and 1.95 ms per step, moving the modelled
    step time by 20 %.  Without a small message inside the burst, the intercept is used."""
    import numpy as np

    if len(sizes) != len(latencies) or len(sizes) < 2:
        raise ValueError(f"fit_link needs at least two (size, latency) pairs, got {len(sizes)} and {len(latencies)}")
    order = np.argsort(sizes)
    s = np.asarray(sizes, dtype=float)[order]
    y = np.asarray(latencies, dtype=float)[order]
    wire = 2 * (world - 1) / world * s
    big = wire >= 8 * burst_bytes
    if big.sum() < 2:
        big = np.ones_like(big)  # too few: fit over every message
    alpha_fit, bw = fit_alpha_beta(list(s[big]), list(y[big]), world)
    if burst_bytes > 0 and wire[0] <= burst_bytes:
        return float(y[0]) / (2 * (world - 1)), bw
    return alpha_fit, bw
