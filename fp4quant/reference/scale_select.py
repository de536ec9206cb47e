"""Per micro-group scale selection, "4 over 6" (arXiv 2512.02010), on the unchanged wire format.

The default E4M3 micro-scale maps a micro-group's largest magnitude to 6, the FP4 maximum.
FP4's grid is coarse near its top (4 -> 6), so a micro-group whose values sit around 5
is sometimes better served by a scale mapping its maximum to 4 (the grid then reaches
1.5x beyond the maximum, unused, but the values below it land on a finer grid).  Each
micro-group is encoded both ways and keeps the one with the lower squared error (ties
keep the default).  Only the stored micro-scale and the codes of a micro-group differ:
coarse scales and layout are those of ``config``, so the message decodes with the
ordinary ``dequantize``.  Under a coarse scale of amax / (6 * 448) the micro-groups
holding the block's largest values cannot take the 4 (their scale would pass 448 and
saturate), so they keep a default-like choice.

    packed, chose_four = select(x, QuantConfig.preset("no_fwht"))
    y = dequantize(packed)        # the ordinary decoder
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..format.config import QuantConfig, as_config
from ..format.packed import Packed, check_float_dtype, layout
from .codec import decode_normalized, encode
from .fwht import fwht

TARGETS = (6.0, 4.0)  # the default first: it wins ties


def _check(config: QuantConfig) -> None:
    if config.element != "e2m1" or config.micro_scale != "e4m3" or config.rounding != "nearest":
        raise ValueError("4-over-6 scale selection needs element='e2m1', micro_scale='e4m3' and rounding='nearest', "
                         f"got {config}")


def _transformed(flat: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """The padded values in the domain the codes live in (after the FWHT, if any)."""
    padded = F.pad(flat, (0, layout(flat.numel(), config).padded - flat.numel()))
    if config.fwht == "two_level":
        return fwht(padded, config.group, signs=config.fwht_seed, micro=config.micro_group)
    return padded


def select(x: torch.Tensor, config: QuantConfig | str) -> tuple[Packed, torch.Tensor]:
    """``x`` compressed under ``config`` with each micro-group's scale chosen by 4-over-6, and
    the bool mask of the micro-groups that took the 4 (one per micro-group of the padded message)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"select expects a torch.Tensor, got {type(x).__name__}")
    config = as_config(config)
    _check(config)
    check_float_dtype(x.dtype)
    flat = x.detach().reshape(-1).to(torch.float32)
    packs = [encode(flat, x.shape, x.dtype, config, 0, 0, transform=True, element_target=t) for t in TARGETS]
    if flat.numel() == 0:
        return packs[0], torch.zeros(0, dtype=torch.bool)
    if not torch.equal(packs[0].coarse_scales, packs[1].coarse_scales):
        raise AssertionError("the coarse scales do not depend on the micro-scale target")
    y = _transformed(flat, config).view(-1, config.micro_group)
    errors = [((decode_normalized(p, None).view_as(y) - y) ** 2).sum(dim=1) for p in packs]
    four = errors[1] < errors[0]  # NaN (a non-finite micro-group) keeps the default
    codes = torch.where(four[:, None], packs[1].codes.view(four.numel(), -1), packs[0].codes.view(four.numel(), -1))
    scales = torch.where(four, packs[1].micro_scales, packs[0].micro_scales)
    packed = Packed(codes.reshape(-1), scales, packs[0].coarse_scales, x.shape, x.dtype, config)
    return packed, four


def quantize(x: torch.Tensor, config: QuantConfig | str) -> Packed:
    """``x`` compressed under ``config`` with 4-over-6 micro-scales (decode with fp4quant's dequantize)."""
    return select(x, config)[0]
