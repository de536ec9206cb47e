"""fp4quant: FP4 communication compression for tensor-parallel LLM training."""

from __future__ import annotations

import torch

from . import ops
from .format import PRESETS, Packed, QuantConfig, as_config
from .reference import fwht, ifwht

__version__ = "0.1.0"


def quantize(
    x: torch.Tensor, config: QuantConfig | str | None = None, *, generator: torch.Generator | None = None
) -> Packed:
    """Compress ``x`` under ``config``: a QuantConfig, a preset name, or None (the fp4quant preset).

    With stochastic rounding the random stream is seeded from ``generator`` (or
    torch's default generator), so the same generator state gives the same bits.
    """
    config = QuantConfig() if config is None else as_config(config)
    seed = 0
    if config.rounding == "stochastic":
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return ops.quantize(x, config, seed=seed)


def dequantize(packed: Packed) -> torch.Tensor:
    """The tensor a Packed stands for, in its original shape and dtype."""
    return ops.dequantize(packed)


__all__ = ["PRESETS", "Packed", "QuantConfig", "__version__", "dequantize", "fwht", "ifwht", "quantize"]
