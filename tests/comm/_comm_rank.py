"""What every check of the multi-process suite shares: the rank's place in the job, inputs each
rank can recompute for every other, and the measures the tests judge (NMSE, bit-identity)."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from fp4quant.format.config import QuantConfig

COMPRESSED = ("fp4quant", "no_fwht", "single_scale", "nvfp4", "mxfp4", "int4", "fp8")
ALGOS = ("one_shot", "two_shot")
BLOCK = QuantConfig.preset("fp4quant").block


class Rank:
    """This process in the job, from torchrun's environment (gloo on CPU, or NCCL on its GPU)."""

    def __init__(self) -> None:
        self.backend = os.environ.get("FP4QUANT_TEST_BACKEND", "gloo")
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        if self.backend == "nccl":
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    def inp(self, rank: int, n: int, dtype=torch.float32, seed: int = 0, shape=None) -> torch.Tensor:
        """Rank ``rank``'s input: the same on every process that asks (so each rank knows all)."""
        g = torch.Generator().manual_seed(seed * 7919 + rank)
        x = torch.randn(n, generator=g).to(dtype)
        return x.reshape(shape if shape is not None else (n,)).to(self.device)

    def exact(self, n: int, dtype=torch.float32, seed: int = 0, ranks=None) -> torch.Tensor:
        """The float64 sum of the ranks' inputs (all ranks, or ``ranks``)."""
        ranks = range(self.world) if ranks is None else ranks
        return sum(self.inp(r, n, dtype, seed).double() for r in ranks)


def nmse(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.double().reshape(-1), ref.double().reshape(-1)
    return float(((y - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-300))


def bits(t: torch.Tensor) -> torch.Tensor:
    itype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    return t.contiguous().view(itype).to(torch.int32).reshape(-1)


def identical(t: torch.Tensor, group=None) -> bool:
    """Bit-identical on every rank of ``group``."""
    b = bits(t)
    outs = [torch.empty_like(b) for _ in range(dist.get_world_size(group))]
    dist.all_gather(outs, b, group=group)
    return all(torch.equal(o, outs[0]) for o in outs)


def equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def raised(fn: Callable[[], Any]) -> dict[str, str] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
        return {"type": type(exc).__name__, "msg": str(exc)}
    return None
