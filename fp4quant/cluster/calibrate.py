"""Scale-model calibration: pick the emulated link so that compute : bandwidth matches a target cluster.

A TP training step on H100 nodes spends its time computing at the GPUs' sustained
FLOP/s and communicating at the inter-node links' bandwidth.  On this machine each
emulated rank computes far slower, so the emulated link is slowed by the same factor:

    emulated bytes/s = measured FLOP/s per rank x (target link bytes/s / target FLOP/s per GPU)

and every other component of the time by the same factor, ``time_dilation``:

latency  the target's per-hop latency x time_dilation: shaped on the link where the kernel
         has netem, else slept before each wire step of a collective by the ranks
         (fp4quant.comm.dilation; the cluster runner passes it)
codec    the target's codec moves its bytes at ``codec_hbm_fraction`` of the HBM bandwidth;
         each codec op of a rank is stretched (slept) to that time x time_dilation
         (``codec_bytes_per_s``; the rank's CPU codec is otherwise 7-13x too cheap)
burst    the link's token bucket holds rate x netns.LinkSpec.burst_s, the least tbf
         sustains its rate with: the same few milliseconds at every rate

The measured figures (training FLOP/s of one rank's thread, codec throughputs at the
training run's message size) are what the performance model uses to predict the
emulated runs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from .. import comm, ops
from ..format.config import QuantConfig
from ..models import ModelConfig, Qwen2ForCausalLM
from ..comm import exchange
from .dilation import TARGET_VALUE_BYTES
from ..comm.plan import shard_values
from ..parallel import CommConfig, TPCommunicator
from .netns import LinkSpec


@dataclass(frozen=True)
class TargetCluster:
    """The cluster the scale model stands for (figures are assumptions, stated in every result)."""

    name: str = "H100 SXM nodes, 8 GPUs each, NVLink 4 inside, 400 Gb/s InfiniBand NDR per GPU across"
    flops_per_gpu: float = 400e12  # sustained BF16 training FLOP/s: ~40% of the 989 TFLOP/s dense peak
    intra_node_bw: float = 370e9  # bytes/s per GPU: NCCL ring bus bandwidth over NVLink 4
    inter_node_bw: float = 50e9  # bytes/s per GPU: one 400 Gb/s NIC per GPU
    intra_node_latency: float = 5e-6  # seconds per collective step
    inter_node_latency: float = 10e-6
    gpus_per_node: int = 8
    hbm_bw: float = 3.35e12  # bytes/s
    codec_hbm_fraction: float = 0.7  # the codec kernels are memory-bound at this fraction of hbm_bw
    # (the performance model's H100 assumption, perfmodel.machines.H100_CODEC_EFFICIENCY)


class CollectiveGaps:
    """Idle gaps of ``gap_s`` at the places of a TP step's collectives on a shard run alone
    (world 1, where its mappings send nothing): after the embedding and each attention and
    MLP block forward, and as the gradients of each attention and MLP block's input and the
    LM head's input are ready backward: 2 x (2 x layers + 1) a step, as the run's all-reduces.
    ``slept_s`` sums the gaps since ``reset`` (the step's time leaves them out).  Why: a run's
    waits on the link idle a rank's core and cool its caches, which slows its compute.

    ``codec`` (a CommConfig): each gap also runs the codec of a two-shot all-reduce over
    ``world`` ranks on the tensor the run would send there (the block's output forward, its
    input gradient backward), under that direction's QuantConfig: quantize, half the gap,
    dequantize-reduce, the other half, dequantize, so that each op meets its data as a run's
    does.  ``codec_s`` sums each direction's seconds per op (``codec_calls`` its calls); the
    step's time leaves them out (``codec_total_s``).

    ``latency_bytes`` (needs a process group of ``world`` ranks running the same steps): each
    wait ends in a real transfer of that many bytes per rank with the run's primitive there
    (BF16: an all-reduce; compressed: the two-shot's exchanges, fp4quant.comm.exchange).  So
    small a message rides on the link's burst: its time is the latency a run's all-reduces meet
    after compute, wake-up and round trip included.  ``transfer_s`` sums their seconds since
    ``reset`` and ``wire_steps`` their wire steps (2 (W - 1) a wait); the step's time leaves
    them out."""

    OPS = ("quantize", "dequantize_reduce", "dequantize")

    def __init__(self, net: Qwen2ForCausalLM, gap_s: float, codec: CommConfig | None = None, world: int = 1,
                 latency_bytes: int = 0):
        if codec is not None and world < 2:
            raise ValueError(f"the codec of a two-shot all-reduce needs a world of at least 2, got {world}")
        if latency_bytes and (world < 2 or latency_bytes < 2 * world):
            raise ValueError(f"in-step transfers need a world of at least 2 and at least 2 bytes a rank, "
                             f"got world {world} and {latency_bytes} bytes")
        self.gap_s, self.codec, self.world = gap_s, codec, world
        self._decoded: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # decode buffers by (values, dtype)
        self.latency_bytes = latency_bytes
        if latency_bytes:
            per_rank = latency_bytes // world
            self._reduced = torch.zeros(latency_bytes // 2, dtype=torch.bfloat16)
            self._send = torch.zeros(world, per_rank, dtype=torch.uint8)
            self._recv = torch.empty_like(self._send)
        self.reset()
        blocks = [m for layer in net.model.layers for m in (layer.self_attn, layer.mlp)]
        self.handles = [m.register_forward_hook(self._forward) for m in (net.model.embed_tokens, *blocks)]
        self.handles += [m.register_full_backward_hook(self._backward) for m in (*blocks, net.lm_head)]

    def reset(self) -> None:
        self.slept_s, self.naps = 0.0, 0
        self.transfer_s, self.wire_steps = 0.0, 0
        self.codec_s = {d: dict.fromkeys(self.OPS, 0.0) for d in ("fwd", "bwd")}
        self.codec_calls = {"fwd": 0, "bwd": 0}

    @property
    def codec_total_s(self) -> float:
        return sum(sum(ops_.values()) for ops_ in self.codec_s.values())

    def _sleep(self, seconds: float) -> None:
        t = time.perf_counter()
        time.sleep(seconds)
        self.slept_s += time.perf_counter() - t

    def _transfer(self, primitive: str) -> None:
        """One small transfer with the peers (see the class doc); nothing without latency_bytes."""
        if not self.latency_bytes:
            return
        t = time.perf_counter()
        if primitive == "all_reduce":
            dist.all_reduce(self._reduced)
            self.wire_steps += 2 * (self.world - 1)
        else:  # one phase of the two-shot: W - 1 wire steps
            if primitive == "all_to_all":
                exchange.all_to_all(self._recv, self._send)
            else:
                exchange.all_gather(self._recv, self._send[0])
            self.wire_steps += self.world - 1
        self.transfer_s += time.perf_counter() - t

    def _nap(self, direction: str, sent: torch.Tensor | None) -> None:
        self.naps += 1
        config = getattr(self.codec, direction) if self.codec is not None else None
        if config is None or not config.compressed or sent is None:
            self._sleep(self.gap_s)
            self._transfer("all_reduce")
            return
        flat = sent.detach().reshape(-1)
        shard = shard_values(flat.numel(), self.world, config.block)
        if flat.numel() < self.world * shard:
            flat = torch.cat([flat, flat.new_zeros(self.world * shard - flat.numel())])
        seconds = self.codec_s[direction]
        t = time.perf_counter()
        msgs = ops.quantize_rows(flat.view(self.world, shard), config, 1, 0)
        seconds["quantize"] += time.perf_counter() - t
        self._sleep(self.gap_s / 2)
        self._transfer("all_to_all")
        t = time.perf_counter()
        reduced = ops.dequantize_reduce(msgs, shard, config, flat.dtype, requantize=True, seed=1, offset=0)
        seconds["dequantize_reduce"] += time.perf_counter() - t
        self._sleep(self.gap_s / 2)
        self._transfer("all_gather")
        gathered = reduced.repeat(self.world).view(self.world, -1)  # stands for the shards the peers send
        # the run decodes into the all-reduce's own tensor, here a buffer kept as long (not the
        # model's activation, which the probe's step goes on computing with)
        out = self._decoded.get((flat.numel(), flat.dtype))
        if out is None:
            out = self._decoded[(flat.numel(), flat.dtype)] = torch.empty_like(flat)
        t = time.perf_counter()
        ops.dequantize_rows(gathered, shard, config, flat.dtype, saturate=False, out=out.view(self.world, shard))
        seconds["dequantize"] += time.perf_counter() - t
        self.codec_calls[direction] += 1

    def _forward(self, module, inputs, output) -> None:
        self._nap("fwd", output if isinstance(output, torch.Tensor) else None)

    def _backward(self, module, grad_input, grad_output) -> None:
        self._nap("bwd", grad_input[0] if grad_input and isinstance(grad_input[0], torch.Tensor) else None)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class InStepCollectives(CollectiveGaps):
    """At CollectiveGaps's places, no idle gap: the run's own all-reduce (TPCommunicator over
    the default group, ``config``'s wire each direction, as the trainer calls it) of a copy of
    the first ``fraction`` of the tensor the run reduces there.  ``transfer_s`` and
    ``wire_steps`` are fp4quant.comm's counters of those calls since ``reset`` (comm_s:
    issuing the collectives and waiting for them, the trainer's communication timer);
    ``codec_total_s`` their codec ops; ``slept_s`` the rest of the calls (copies, buffers),
    so that the step's time leaves the whole calls out.  ``reset`` clears fp4quant.comm's
    process-wide counters.

    Why: bare transfers after idle gaps meet the host's scheduling otherwise than a run does;
    only the run's own code path meets it as the run does.  A ``fraction`` below 1 sends other
    bytes than the run, so that the run's communication is still a prediction
    (fp4quant.perfmodel.model_validation fits the latency to these calls' time where a case has
    no latency runs)."""

    def __init__(self, net: Qwen2ForCausalLM, config: CommConfig, world: int, fraction: float):
        if world < 2:
            raise ValueError(f"in-step collectives need a world of at least 2, got {world}")
        if not 0 < fraction <= 1:
            raise ValueError(f"the in-step collectives' fraction of the run's tensors must be in (0, 1], got {fraction}")
        self.tp = TPCommunicator(dist.group.WORLD, config)
        if self.tp.world != world:
            raise ValueError(f"in-step collectives over the default group of {self.tp.world} ranks, asked for {world}")
        self.fraction, self._sent = fraction, {}
        self._step = 0
        super().__init__(net, 0.0)
        self.world = world

    def reset(self) -> None:
        comm.reset_stats()
        self.call_s, self.naps = 0.0, 0
        self.tp.start_step(self._step)  # the trainer keys its random streams by step
        self._step += 1

    def _total(self, field: str) -> float:
        counters = comm.stats()
        return sum(counters.get(d, {}).get(field, 0) for d in ("fwd", "bwd"))

    @property
    def transfer_s(self) -> float:
        return self._total("comm_s")

    @property
    def wire_steps(self) -> int:
        return int(self._total("wire_steps"))

    @property
    def codec_total_s(self) -> float:
        return self._total("codec_s")

    @property
    def slept_s(self) -> float:
        return self.call_s - self.transfer_s - self.codec_total_s

    @property
    def codec_s(self) -> dict[str, dict[str, float]]:
        """Each direction's seconds in the quantize ops and in the decoding ones
        (dequantize-reduce and dequantize together: fp4quant.comm times them as one)."""
        counters = comm.stats()
        return {d: {"quantize": counters.get(d, {}).get("quantize_s", 0.0),
                    "decode": counters.get(d, {}).get("dequantize_s", 0.0)} for d in ("fwd", "bwd")}

    @property
    def codec_calls(self) -> dict[str, int]:
        counters = comm.stats()
        return {d: int(counters.get(d, {}).get("calls", 0)) for d in ("fwd", "bwd")}

    def _nap(self, direction: str, sent: torch.Tensor | None) -> None:
        if sent is None:
            return
        flat = sent.detach().reshape(-1)
        count = max(1, round(self.fraction * flat.numel()))
        buf = self._sent.get((count, flat.dtype))
        if buf is None:
            buf = self._sent[(count, flat.dtype)] = flat.new_empty(count)
        t = time.perf_counter()
        buf.copy_(flat[:count])
        self.tp.all_reduce(buf, direction)
        self.call_s += time.perf_counter() - t
        self.naps += 1


def rank_step_seconds(model: str, seq_len: int, batch_size: int, tp: int, steps: int,
                      paced: bool = False, collective_gap_s: float = 0.0,
                      scalar_allreduce_s: list[float] | None = None,
                      codec: CommConfig | None = None, codec_s: list[dict] | None = None,
                      latency_bytes: int = 0, transfers: list[dict] | None = None,
                      in_step_collectives: CommConfig | None = None, collective_fraction: float = 1.0) -> list[float]:
    """Seconds of each of ``steps`` whole training steps (forward, backward, AdamW step) of one
    TP rank's shard, after a warm-up step (not returned); ``paced``: each after an idle gap as
    long as the previous step (as a run's compute between link waits); ``collective_gap_s``:
    idle gaps of that length where the run's TP collectives are (CollectiveGaps), left out of
    the times; ``scalar_allreduce_s`` (a list; needs a process group): the trainer's five
    scalar all-reduces run over the default group where it issues them (three after the LM
    head, the gradient norm and the non-finite check after the backward), each step's
    seconds in them appended to it and left out of the step's time; ``latency_bytes`` and
    ``transfers`` (a list; needs a process group of ``tp`` ranks): each gap ends in a small
    real transfer (CollectiveGaps), each step's {"seconds", "wire_steps"} appended to it;
    ``in_step_collectives`` (needs a process group of ``tp`` ranks; no gaps then): the run's
    own all-reduces of ``collective_fraction`` of each tensor there instead (InStepCollectives),
    their seconds in the collectives and wire steps appended to ``transfers``, their codec
    seconds to ``codec_s`` (each direction's quantize and decode, InStepCollectives.codec_s)."""
    cfg = ModelConfig.preset(model)
    # One rank's shard of the model (built for a TP group of `tp`), then run as if alone:
    # at world 1 the mappings send nothing, so this times exactly a rank's compute.
    net = Qwen2ForCausalLM(cfg, TPCommunicator.virtual_group(tp))
    net.tp.world = 1
    if in_step_collectives is not None:
        if collective_gap_s > 0 or codec is not None or latency_bytes:
            raise ValueError("in-step collectives replace the gaps: no collective_gap_s, codec or latency_bytes with them")
        gaps = InStepCollectives(net, in_step_collectives, tp, collective_fraction)
    else:
        gaps = CollectiveGaps(net, collective_gap_s, codec, tp, latency_bytes) if collective_gap_s > 0 else None
    scalar = torch.zeros(1, dtype=torch.float64)
    in_scalar = [0.0]

    def scalar_allreduces(count: int) -> None:
        t = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(scalar)
        in_scalar[0] += time.perf_counter() - t

    if scalar_allreduce_s is not None:  # the vocab-parallel cross-entropy's three
        net.lm_head.register_forward_hook(lambda *_: scalar_allreduces(3))
    ids = torch.randint(0, cfg.vocab_size // tp, (batch_size, seq_len))  # ids within the local vocabulary
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    times: list[float] = []
    for i in range(steps + 1):
        if paced and times:
            time.sleep(times[-1])
        if gaps is not None:
            gaps.reset()
        in_scalar[0] = 0.0
        t0 = time.perf_counter()
        net.loss(ids, ids).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        if scalar_allreduce_s is not None:  # the gradient norm's and the non-finite check's
            scalar_allreduces(2)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        apart = gaps.slept_s + gaps.codec_total_s + gaps.transfer_s if gaps is not None else 0.0
        times.append(time.perf_counter() - t0 - apart - in_scalar[0])
        if scalar_allreduce_s is not None and i > 0:
            scalar_allreduce_s.append(in_scalar[0])
        if codec_s is not None and gaps is not None and i > 0:
            codec_s.append({d: {**ops_, "calls": gaps.codec_calls[d]} for d, ops_ in gaps.codec_s.items()})
        if transfers is not None and gaps is not None and i > 0:
            transfers.append({"seconds": gaps.transfer_s, "wire_steps": gaps.wire_steps})
    return times[1:]


def measure_training_flops(model: str, seq_len: int, batch_size: int, tp: int, threads: int = 1,
                           steps: int = 6) -> float:
    """Sustained FLOP/s of one TP rank's whole training step (forward, backward, AdamW step on
    its 1/tp of the model) on this CPU: FLOPs counted as ModelConfig.flops_per_token."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = rank_step_seconds(model, seq_len, batch_size, tp, steps)
        seconds = sorted(times)[len(times) // 2]
        return ModelConfig.preset(model).flops_per_token(seq_len) * batch_size * seq_len / tp / seconds
    finally:
        torch.set_num_threads(previous)


def measure_codec(values: int, presets: list[str], threads: int = 1, repeats: int = 5) -> dict[str, dict[str, float]]:
    """GB/s (of float32 input) of quantize, dequantize_reduce (2 messages) and dequantize per preset."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, dict[str, float]] = {}
    try:
        x = torch.randn(1, values)
        for name in presets:
            config = QuantConfig.preset(name)
            if not config.compressed:
                continue
            msg = ops.quantize_rows(x, config)
            two = torch.cat([msg, msg])
            decoded = torch.empty_like(x)  # the all-reduce decodes into its own tensor
            cases = {
                "quantize": lambda: ops.quantize_rows(x, config),
                "dequantize_reduce": lambda: ops.dequantize_reduce(two, values, config, torch.float32, True),
                "dequantize": lambda: ops.dequantize_rows(msg, values, config, torch.float32, out=decoded),
            }
            out[name] = {}
            for op, fn in cases.items():
                fn()
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                out[name][op] = 4 * values / sorted(times)[repeats // 2] / 1e9
    finally:
        torch.set_num_threads(previous)
    return out


@dataclass(frozen=True)
class Calibration:
    target: TargetCluster
    rank_flops: float  # measured FLOP/s of one emulated rank
    link_rate_bps: float  # the emulated inter-node link, bits/s
    link_latency_s: float  # the dilated per-hop latency (netem where it exists, else slept per wire step)
    link_burst_bytes: int  # the token bucket's depth: credit the link accrues while idle
    time_dilation: float  # target FLOP/s / measured FLOP/s
    codec_gbps: dict  # measured per preset and op, one thread
    message_values: int  # values per TP all-reduce of the calibrated run
    codec_bytes_per_s: float  # the dilated target codec: codec_hbm_fraction x hbm_bw / time_dilation
    link_burst_s: float  # seconds of the emulated link's traffic the bucket holds

    def to_dict(self) -> dict:
        d = asdict(self)
        d["link_rate_mbit"] = self.link_rate_bps / 1e6
        d["link_burst_target_s"] = self.link_burst_s / self.time_dilation  # what the free burst is worth there
        d["codec_target_value_bytes"] = TARGET_VALUE_BYTES  # a value the target's codec reads or writes (BF16)
        return d


def calibrate(model: str, seq_len: int, batch_size: int, tp: int, presets: list[str],
              target: TargetCluster | None = None) -> Calibration:
    target = target or TargetCluster()
    flops = measure_training_flops(model, seq_len, batch_size, tp)
    dilation = target.flops_per_gpu / flops
    rate_bytes = target.inter_node_bw / dilation
    values = ModelConfig.preset(model).hidden_size * seq_len * batch_size
    link = LinkSpec(8 * rate_bytes, target.inter_node_latency * dilation)
    return Calibration(target, flops, link.rate_bps, link.latency_s, link.burst_bytes, dilation,
                       measure_codec(values, presets), values,
                       target.codec_hbm_fraction * target.hbm_bw / dilation, link.burst_bytes * 8 / link.rate_bps)
