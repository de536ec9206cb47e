"""How the TP linear layers multiply: exactly, or with Quartet's FP4 GEMMs.

``ComputeConfig`` says which (as ``CommConfig`` says how traffic is sent); a
``LinearCompute`` built from it is attached to a model's linear layers once
(``attach``), owns the random streams of Quartet's stochastic backward and is keyed by
step (``start_step``) like the communicator's streams, so a resumed run replays them.

kind "exact"    F.linear in the tensors' own dtype (BF16 under autocast on a GPU, float32
                on a CPU).
kind "quartet"  Quartet's forward and backward quantization (fp4quant.reference.quartet):
                MXFP4 operands of all three GEMMs of each layer, computed as quantize ->
                dequantize -> float32 GEMM.  No FP4 GEMM runs here: on GPUs without FP4
                tensor cores (and on CPUs) this costs time instead of saving it; its
                numbers, not its speed, are Quartet's.

Call ``n`` of layer ``l`` in step ``s`` on TP rank ``r`` draws the seed
derive(derive(derive(derive(derive(seed, STREAM), s), r), l), n) with fp4quant.comm's
one mixing function: each layer's draws depend on its own calls only, never on how many
calls other layers made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..comm import derive
from ..reference.quartet import quartet_linear

COMPUTE_KINDS = ("exact", "quartet")
STREAM = 0x51A7  # separates these streams from the communicator's under the same run seed


@dataclass(frozen=True)
class ComputeConfig:
    """``kind``: "exact" or "quartet"; ``seed``: the base seed of Quartet's backward streams."""

    kind: str = "exact"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE_KINDS:
            raise ValueError(f"compute must be one of {COMPUTE_KINDS}, got {self.kind!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**64:
            raise ValueError(f"compute seed must be an integer in [0, 2**64), got {self.seed!r}")

    @property
    def quantized(self) -> bool:
        return self.kind != "exact"

    def describe(self, device: torch.device) -> str:
        """One line on what runs (for the trainer's log)."""
        if not self.quantized:
            return "compute exact: unquantized GEMMs in the run's precision"
        return (f"compute quartet: pseudo-quantized MXFP4 GEMMs (quantize -> dequantize -> float32 GEMM) on "
                f"{device.type}: FP4 numerics, no FP4 GEMM speed-up")


class LinearCompute:
    """The GEMMs of the linear layers it is attached to, and their random streams."""

    def __init__(self, config: ComputeConfig | None = None, rank: int = 0) -> None:
        self.config = config or ComputeConfig()
        self.rank = rank
        self.step: int | None = None
        self.calls: list[int] = []  # per attached layer, calls since the step began

    def attach(self, model: nn.Module, skip: tuple[nn.Module, ...] = ()) -> int:
        """Route every ColumnParallelLinear / RowParallelLinear of ``model`` (except ``skip``)
        through this object, numbered in module order; returns how many."""
        from .layers import ColumnParallelLinear, RowParallelLinear

        skipped = {id(m) for m in skip}
        for module in model.modules():
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and id(module) not in skipped:
                module.compute, module.compute_index = self, len(self.calls)
                self.calls.append(0)
        return len(self.calls)

    def start_step(self, step: int) -> None:
        """Key the streams by ``step`` and restart every layer's call counter."""
        self.step = step
        self.calls = [0] * len(self.calls)

    def seed(self, index: int) -> int:
        """The seed of layer ``index``'s next call (advances its counter)."""
        base = derive(self.config.seed, STREAM)
        if self.step is not None:
            base = derive(base, self.step)
        n = self.calls[index]
        self.calls[index] += 1
        return derive(derive(derive(base, self.rank), index), n)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, index: int) -> torch.Tensor:
        if not self.config.quantized:
            return F.linear(x, weight, bias)
        return quartet_linear(x, weight, bias, self.seed(index))


def linear(module: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A parallel layer's local GEMM: through its LinearCompute if one is attached."""
    compute = getattr(module, "compute", None)
    if compute is None:
        return F.linear(x, module.weight, bias)
    return compute.linear(x, module.weight, bias, module.compute_index)
