"""QuantConfig <-> the int[] config of the native ops (csrc/fp4quant.h: enum values, field order)."""

from __future__ import annotations

from ..format.config import QuantConfig

ELEMENT = {"e2m1": 0, "int4": 1, "e4m3": 2}
SCALE = {"e4m3": 0, "e8m0": 1, "fp16": 2, "none": 3}
COARSE = {"group": 0, "tensor": 1, "none": 2}
SCALE_ROUND = {"nearest": 0, "up": 1, "floor": 2}
ROUNDING = {"nearest": 0, "stochastic": 1}
PACKING = {"warp": 0, "naive": 1}


def _inverse(d: dict[str, int]) -> dict[int, str]:
    return {v: k for k, v in d.items()}


def to_codes(config: QuantConfig) -> list[int]:
    """[element, micro_group, group, micro_scale, coarse, scale_round, fwht, rounding, packing]."""
    if not config.compressed:
        raise ValueError("the bf16 preset has no native kernel: it is no compression")
    return [
        ELEMENT[config.element],
        config.micro_group,
        config.group,
        SCALE[config.micro_scale],
        COARSE[config.coarse_scale],
        SCALE_ROUND[config.scale_round],
        int(config.fwht == "two_level"),
        ROUNDING[config.rounding],
        PACKING[config.packing],
    ]


def from_codes(codes) -> QuantConfig:
    """The QuantConfig of an int[] config (fwht_seed is not part of it: signs travel apart)."""
    c = [int(v) for v in codes]
    return QuantConfig(
        element=_inverse(ELEMENT)[c[0]],
        micro_group=c[1],
        group=c[2],
        micro_scale=_inverse(SCALE)[c[3]],
        coarse_scale=_inverse(COARSE)[c[4]],
        scale_round=_inverse(SCALE_ROUND)[c[5]],
        fwht="two_level" if c[6] else "none",
        fwht_seed=None,
        rounding=_inverse(ROUNDING)[c[7]],
        packing=_inverse(PACKING)[c[8]],
    )


def signed64(value: int) -> int:
    """A uint64 (seed, counter offset) as the int64 the op schema carries."""
    return value - (1 << 64) if value >= 1 << 63 else value
