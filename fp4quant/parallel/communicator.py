"""TPCommunicator: the one place tensor-parallel traffic goes through.

It owns both directions: the forward all-reduce of activations after row-parallel
layers ("fwd") and the backward all-reduce of input gradients before column-parallel
layers ("bwd") -- and, with sequence parallelism, the all-gathers and reduce-scatters
that replace them.  Each direction is resolved once, when the communicator is built, to
a ``Route``: the wire it sends (fp4quant.comm.Wire: exact, cast to bf16, or compressed
under its own QuantConfig -- stochastic rounding suits gradients) and the stats key it
is counted under in fp4quant.comm.stats().

A direction's config in CommConfig is one of: None (exact: the tensor's own dtype, as
PyTorch sends it); the ``bf16`` preset (BF16 on the wire -- what a BF16 training run
sends -- so a float32 tensor is cast for the collective and back); or a compressed
preset.

The communicator owns the random streams of its compressed calls (a RandomStreams of
``CommConfig.seed``); a trainer keys them by step with ``start_step``, so a resumed run
replays them exactly.  Given a TrafficCapture (fp4quant.parallel.capture), it hands it
this rank's contribution to every collective of a captured step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dataclasses import replace

from ..comm import DEFAULT_CHUNK_BYTES, Options, RandomStreams, Wire, all_gather, all_reduce, reduce_scatter
from ..comm.local import is_local
from ..format.config import QuantConfig
from .capture import TrafficCapture

COMPRESS_CHOICES = ("none", "fwd", "bwd", "both")
DIRECTIONS = ("fwd", "bwd")
EXACT_OPTIONS = Options(Wire.exact(), stats_key="exact")  # all_reduce_exact's


@dataclass(frozen=True)
class CommConfig:
    """How TP traffic is sent.  ``fwd`` / ``bwd``: the QuantConfig of each direction, or None
    for exact; ``algorithm``, ``chunk_bytes``, ``overlap`` and ``sync_timing`` as in
    fp4quant.comm.all_reduce; ``seed``: the base seed of the communicator's random streams;
    ``validate``: validate every collective across ranks (one record through the store each; a
    trainer validates its first step whatever this says)."""

    fwd: QuantConfig | None = None
    bwd: QuantConfig | None = None
    algorithm: str = "two_shot"
    chunk_bytes: int | str | None = DEFAULT_CHUNK_BYTES
    seed: int = 0
    validate: bool = False
    overlap: bool = True
    sync_timing: bool = False
    ranks_per_node: int | None = None  # the hierarchical algorithm's node layout (None: LOCAL_WORLD_SIZE)
    intra_wire: str = "exact"  # the hierarchical algorithm's all-gather inside a node
    # at TP = 1 (nothing sent), round the tensors each all-reduce would carry as its cast wire
    # does (to its dtype and back): the wire's rounding without communication (a control run)
    rounding_alone: bool = False

    def __post_init__(self) -> None:
        if self.rounding_alone and any(q is None or q.compressed for q in (self.fwd, self.bwd)):
            raise ValueError("rounding_alone needs a cast wire (the bf16 preset) in both directions")

    def options(self, direction: str) -> Options:
        """The one fp4quant.comm.Options of ``direction``'s collectives (its wire, counted under
        its own stats key), built once by the communicator."""
        return Options(Wire.of(getattr(self, direction), uncompressed="cast"), algorithm=self.algorithm,
                       chunk_bytes=self.chunk_bytes, overlap=self.overlap, validate=self.validate,
                       sync_timing=self.sync_timing, stats_key=direction, ranks_per_node=self.ranks_per_node,
                       intra_wire=self.intra_wire)

    @classmethod
    def from_preset(cls, preset: str, compress: str = "both", stochastic_backward: bool = True, **kwargs) -> CommConfig:
        """``preset`` applied to the directions ``compress`` names, BF16 on the wire for the
        others.  ``preset`` "exact" sends every direction uncompressed in its own dtype."""
        if compress not in COMPRESS_CHOICES:
            raise ValueError(f"compress must be one of {COMPRESS_CHOICES}, got {compress!r}")
        if preset == "exact":
            return cls(**kwargs)
        bf16 = QuantConfig.preset("bf16")
        config = QuantConfig.preset(preset)
        if not config.compressed:
            return cls(fwd=bf16, bwd=bf16, **kwargs)
        fwd = config if compress in ("fwd", "both") else bf16
        bwd = bf16
        if compress in ("bwd", "both"):
            # stochastic rounding brings its unbiased micro-scale rule (scale_round="up") with it
            bwd = config.replace(rounding="stochastic") if stochastic_backward else config
        return cls(fwd=fwd, bwd=bwd, **kwargs)


@dataclass(frozen=True)
class Route:
    """How a direction's traffic goes: its collectives' Options, and the same validating."""

    options: Options
    validating: Options

    @classmethod
    def of(cls, config: CommConfig, direction: str) -> Route:
        options = config.options(direction)
        return cls(options, replace(options, validate=True))

    @property
    def wire(self) -> Wire:
        return self.options.wire

    @property
    def stats_key(self) -> str:
        return self.options.stats_key


class TPCommunicator:
    """Collectives of one tensor-parallel group.  With TP = 1 nothing is sent (and nothing compressed)."""

    def __init__(self, group: dist.ProcessGroup | None, config: CommConfig | None = None,
                 capture: TrafficCapture | None = None):
        self.group = group
        self.capture = capture
        self.config = config or CommConfig()
        self.routes = {d: Route.of(self.config, d) for d in DIRECTIONS}
        self.streams = RandomStreams(self.config.seed)
        self.validate = self.config.validate
        if is_local(group):  # simulated ranks (fp4quant.comm.local)
            self.world, self.rank = group.world, group.rank
        else:
            self.world = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
            self.rank = dist.get_rank(group) if group is not None and dist.is_initialized() else 0
        self.virtual = False

    def __deepcopy__(self, memo) -> TPCommunicator:
        # a handle on a process group and the one owner of its streams: shared, never copied
        # (a deep copy of a model, or of a DeviceMesh that keeps it, as torch.compile's guards make)
        return self

    @classmethod
    def virtual_group(cls, world: int, rank: int = 0) -> TPCommunicator:
        """A stand-in for rank ``rank`` of a group of ``world`` that cannot communicate: for
        building models on the meta device to size them (fp4quant.models.memory)."""
        c = cls(None)
        c.world, c.rank, c.virtual = world, rank, True
        return c

    def start_step(self, step: int, validate: bool = False) -> None:
        """Key the random streams by ``step`` (a resumed run replays them); ``validate``: check
        this step's collectives across ranks (besides CommConfig.validate)."""
        self.streams.start_step(step)
        if self.capture is not None:
            self.capture.start_step(step)
        self.validate = validate or self.config.validate

    def _prepare(self, direction: str, x: torch.Tensor) -> dict:
        """Check ``direction``, hand ``x`` (this rank's contribution) to the capture if any, and
        return the collective's arguments: the direction's Options, as they were built."""
        if direction not in self.routes:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if self.capture is not None:
            self.capture.record(direction, x)
        route = self.routes[direction]
        return dict(group=self.group, streams=self.streams, options=route.validating if self.validate else route.options)

    def _check_real(self) -> None:
        if self.virtual:
            raise RuntimeError("a virtual TPCommunicator (for sizing models) cannot communicate")

    @property
    def sends(self) -> bool:
        """Whether the all-reduce mappings call this communicator: TP > 1, or the wire's
        rounding applied alone (CommConfig.rounding_alone)."""
        return self.world > 1 or self.config.rounding_alone

    def all_reduce(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Sum over the group, in place; returns x."""
        self._check_real()
        if self.world > 1:
            all_reduce(x, **self._prepare(direction, x))
        elif self.config.rounding_alone:
            x.copy_(x.to(self.routes[direction].wire.dtype).to(x.dtype))
        return x

    def all_gather(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Concatenate the ranks' x along dim 0."""
        self._check_real()
        if self.world == 1:
            return x
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))
        all_gather(out, x, **self._prepare(direction, x))
        return out

    def reduce_scatter(self, x: torch.Tensor, direction: str) -> torch.Tensor:
        """Sum over the group and keep this rank's slice of dim 0."""
        self._check_real()
        if self.world == 1:
            return x
        if x.shape[0] % self.world:
            raise ValueError(f"dim 0 ({x.shape[0]}) is not divisible by the TP size {self.world}")
        out = x.new_empty((x.shape[0] // self.world, *x.shape[1:]))
        reduce_scatter(out, x, **self._prepare(direction, x))
        return out

    def all_reduce_exact(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Uncompressed all-reduce for the small, exact reductions (softmax statistics, norms):
        "sum" or "max", counted under the stats key "exact" (the trainer's scalar time).  A sum
        is gathered and added in rank order: the same bits whatever order the backend would
        add in (gloo's ring, NCCL's, a simulated group's), at the cost of (W-1) N values sent
        instead of 2 (W-1)/W N -- these tensors are one value per token."""
        self._check_real()
        if self.world == 1:
            return x
        if op in ("max", dist.ReduceOp.MAX):
            all_reduce(x, group=self.group, op="max", options=EXACT_OPTIONS)
            return x
        if op not in ("sum", dist.ReduceOp.SUM):
            raise ValueError(f"all_reduce_exact: op must be sum or max, got {op!r}")
        flat = x.detach().reshape(-1).contiguous()
        gathered = flat.new_empty(self.world * flat.numel())
        all_gather(gathered, flat, group=self.group, options=EXACT_OPTIONS)
        parts = gathered.view(self.world, -1)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        x.copy_(total.view_as(x))
        return x
