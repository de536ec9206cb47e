"""QuantConfig: what a compressed tensor looks like on the wire, and its presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .elements import ELEMENT_BITS, ELEMENT_GRIDS, SCALE_BYTES, SCALE_MAX

ELEMENTS = ("e2m1", "int4", "e4m3", "bf16")
MICRO_SCALES = ("e4m3", "e8m0", "fp16", "none")
COARSE_SCALES = ("group", "tensor", "none")
FWHTS = ("two_level", "none")
ROUNDINGS = ("nearest", "stochastic")
PACKINGS = ("warp", "naive")
SCALE_ROUNDS = {"e4m3": ("nearest", "up"), "fp16": ("nearest", "up"), "e8m0": ("floor", "up"), "none": ("nearest",)}
_DEFAULT_SCALE_ROUND = {"e4m3": "nearest", "fp16": "nearest", "e8m0": "floor", "none": "nearest"}


def default_scale_round(micro_scale: str, rounding: str) -> str:
    """The micro-scale rule a config gets when it names none: the format's usual rule, or
    "up" under stochastic rounding (a scale rounded down makes the largest values of its
    micro-group saturate at the element maximum, and saturation is biased)."""
    if rounding == "stochastic" and micro_scale != "none":
        return "up"
    return _DEFAULT_SCALE_ROUND[micro_scale]

# The default group (coarse-scale block and FWHT size) of the fp4quant method, chosen
# with `python -m fp4quant.bench.error` (see data/error.csv and the README).
DEFAULT_GROUP = 2048
MAX_GROUP = 1 << 16


def _is_pow2(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class QuantConfig:
    """How a tensor is compressed.  Frozen; validated on construction.

    element       value format: "e2m1" (FP4), "int4", "e4m3" (FP8), "bf16" (no compression)
    micro_group   values per micro-scale (and the FWHT's first level); power of two
    group         values per coarse scale and per FWHT block; power of two, multiple of micro_group
    micro_scale   "e4m3", "e8m0", "fp16" or "none"
    coarse_scale  "group" (FP32 per group), "tensor" (one FP32 per message) or "none"
    scale_round   how the micro-scale is rounded: "nearest" or "up" (never saturates)
                  for e4m3/fp16, "floor" (OCP) or "up" for e8m0; default: the format's usual
                  rule, "up" with stochastic rounding (the only rule it allows: see
                  default_scale_round)
    fwht          "two_level" (orthonormal Walsh-Hadamard of size `group` first) or "none"
    fwht_seed     seed of the random +-1 signs applied before the FWHT, or None for none
    rounding      "nearest" (ties to even) or "stochastic" (unbiased)
    packing       "warp" or "naive": how GPU kernels store nibbles; identical bytes
    """

    element: str = "e2m1"
    micro_group: int = 16
    group: int = DEFAULT_GROUP
    micro_scale: str = "e4m3"
    coarse_scale: str = "group"
    scale_round: str | None = None
    fwht: str = "two_level"
    fwht_seed: int | None = 0
    rounding: str = "nearest"
    packing: str = "warp"

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"QuantConfig.{field} {why}, got {getattr(self, field)!r}")

        for field, allowed in (
            ("element", ELEMENTS),
            ("micro_scale", MICRO_SCALES),
            ("coarse_scale", COARSE_SCALES),
            ("fwht", FWHTS),
            ("rounding", ROUNDINGS),
            ("packing", PACKINGS),
        ):
            if getattr(self, field) not in allowed:
                raise bad(field, f"must be one of {allowed}")
        if not _is_pow2(self.micro_group) or self.micro_group < 2:
            raise bad("micro_group", "must be a power of two >= 2")
        if not _is_pow2(self.group) or self.group < self.micro_group or self.group > MAX_GROUP:
            raise bad("group", f"must be a power of two, a multiple of micro_group ({self.micro_group}), at most {MAX_GROUP}")
        if self.scale_round is None:
            object.__setattr__(self, "scale_round", default_scale_round(self.micro_scale, self.rounding))
        if self.scale_round not in SCALE_ROUNDS[self.micro_scale]:
            raise bad("scale_round", f"must be one of {SCALE_ROUNDS[self.micro_scale]} for micro_scale={self.micro_scale!r}")
        if self.scale_round != default_scale_round(self.micro_scale, self.rounding) == "up":
            raise bad(
                "scale_round",
                "must be 'up' (or unset) with rounding='stochastic': a rounded-down micro-scale saturates "
                "the largest values of its micro-group, which biases stochastic rounding",
            )
        if self.fwht_seed is not None and (
            not isinstance(self.fwht_seed, int) or isinstance(self.fwht_seed, bool) or not 0 <= self.fwht_seed < 2**64
        ):
            raise bad("fwht_seed", "must be None or an integer in [0, 2**64)")
        if self.element == "bf16":
            return
        if self.micro_scale in ("e8m0", "fp16") and self.coarse_scale != "none":
            raise bad("coarse_scale", f"must be 'none' with micro_scale={self.micro_scale!r} (its range needs no coarse scale)")
        if self.micro_scale == "none" and self.coarse_scale == "none":
            raise bad("coarse_scale", "must be 'group' or 'tensor' when micro_scale is 'none' (a format needs a scale)")

    # --- presets -----------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> QuantConfig:
        """A named configuration (see PRESETS), optionally with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with ``changes``; a scale_round that is the default of this config follows the
        changed fields (``preset("mxfp4").replace(rounding="stochastic")`` rounds its scales up)."""
        if "scale_round" not in changes and self.scale_round == default_scale_round(self.micro_scale, self.rounding):
            changes["scale_round"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantConfig:
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"QuantConfig has no field(s) {sorted(unknown)}")
        return cls(**d)

    # --- derived quantities ------------------------------------------------------

    @property
    def compressed(self) -> bool:
        return self.element != "bf16"

    @property
    def block(self) -> int:
        """Messages are zero-padded to a multiple of this many values."""
        if not self.compressed:
            return 1
        if self.fwht != "none" or self.coarse_scale == "group":
            return self.group
        return self.micro_group

    @property
    def element_max(self) -> float:
        return ELEMENT_GRIDS[self.element].max

    @property
    def coarse_divisor(self) -> float:
        """coarse scale = block amax / coarse_divisor (2688 = 6 * 448 for FP4 under E4M3)."""
        return self.element_max * SCALE_MAX.get(self.micro_scale, 1.0)

    @property
    def bits_per_value(self) -> float:
        """Bits on the wire per value for a long message (padding excluded)."""
        bits = float(ELEMENT_BITS[self.element])
        if not self.compressed:
            return bits
        bits += 8 * SCALE_BYTES[self.micro_scale] / self.micro_group
        if self.coarse_scale == "group":
            bits += 32 / self.group
        return bits

    def __str__(self) -> str:
        for name, fields in PRESETS.items():
            if self == QuantConfig(**fields):
                return name
        default = QuantConfig()
        diff = {k: v for k, v in self.to_dict().items() if getattr(default, k) != v}
        return "QuantConfig(" + ", ".join(f"{k}={v!r}" for k, v in diff.items()) + ")"


PRESETS: dict[str, dict[str, Any]] = {
    # the full method: FP4 values, E4M3 micro-scales under an FP32 per-group scale, two-level FWHT
    "fp4quant": {},
    # ablations of the method, one mechanism removed each
    "no_fwht": {"fwht": "none"},
    "single_scale": {"coarse_scale": "none"},
    "naive_pack": {"packing": "naive"},
    # baselines
    "nvfp4": {"micro_group": 16, "group": 16, "coarse_scale": "tensor", "fwht": "none", "fwht_seed": None},
    "mxfp4": {"micro_group": 32, "group": 32, "micro_scale": "e8m0", "coarse_scale": "none", "fwht": "none", "fwht_seed": None},
    "int4": {"element": "int4", "micro_group": 32, "group": 32, "micro_scale": "fp16", "coarse_scale": "none", "fwht": "none", "fwht_seed": None},
    "fp8": {"element": "e4m3", "micro_scale": "none", "fwht": "none", "fwht_seed": None},
    "bf16": {"element": "bf16", "fwht": "none", "fwht_seed": None},
}


def as_config(config: QuantConfig | str) -> QuantConfig:
    """``config`` itself, or the preset it names: what every entry point that takes a config accepts."""
    if isinstance(config, QuantConfig):
        return config
    if isinstance(config, str):
        return QuantConfig.preset(config)
    raise TypeError(f"config must be a QuantConfig or a preset name ({', '.join(PRESETS)}), got {type(config).__name__}")
