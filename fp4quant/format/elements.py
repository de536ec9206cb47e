"""Element and scale number formats, and how a float32 value is rounded onto them.

Everything here works on float32 tensors with exact IEEE operations only
(comparisons, power-of-two scaling, floor, one add), so any implementation that
follows the same steps -- the C++ and CUDA kernels do -- gets the same bits.

Element formats (what one value becomes):
  e2m1  OCP FP4: +-{0, .5, 1, 1.5, 2, 3, 4, 6}, code = sign<<3 | exp<<1 | mant
  int4  symmetric integers -7..7, two's complement nibble
  e4m3  OCP FP8 E4M3 ("fn": no infinities, 0x7F is NaN), saturating at 448

Signed zeros: e2m1 and e4m3 have a negative zero (codes 0x8 and 0x80) and keep the sign
of the value, as torch's float8_e4m3fn cast does: -0.0 and negatives that round to zero
encode to it and decode to -0.0.  int4 has none (two's complement; its 0x8 would be -8,
never produced): they decode to +0.0.

Scale formats (what a block's scale becomes):
  e4m3  as above, clamped to [2**-6, 448]: always a normal number, full precision
  fp16  IEEE half, clamped to [2**-14, 65504]
  e8m0  a power of two 2**(b-127), b in 0..254, 255 is NaN (OCP MX)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

F32_MANT_BITS = 23
F32_BIAS = 127


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float32, exact, for integer exponents in [-126, 127]."""
    return ((exponent.to(torch.int32) + F32_BIAS) << F32_MANT_BITS).view(torch.float32)


def exponent_bits(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) read off the float32 exponent field (-127 for zero and subnormals)."""
    return ((a.view(torch.int32) >> F32_MANT_BITS) & 0xFF) - F32_BIAS


@dataclass(frozen=True)
class Grid:
    """A sign-magnitude grid of representable values.

    For a minifloat (``mbits`` is not None) the spacing at magnitude ``a`` is
    ``2**(max(floor(log2 a), emin) - mbits)``: subnormals below ``2**emin``,
    ``mbits`` mantissa bits above.  For an integer grid the spacing is 1.
    """

    name: str
    max: float
    mbits: int | None
    emin: int = 0

    def spacing(self, a: torch.Tensor) -> torch.Tensor:
        if self.mbits is None:
            return torch.ones_like(a)
        e = exponent_bits(a).clamp(min=self.emin)
        return pow2(e - self.mbits)

    def round(self, a: torch.Tensor, mode: str, u: torch.Tensor | None = None) -> torch.Tensor:
        """Round magnitudes ``a >= 0`` (float32) onto the grid, saturating at ``max``.

        mode "nearest": round to nearest, ties to even (the even neighbour is the
        one with an even grid index, i.e. an even last mantissa bit);
        "up": the smallest grid value >= a; "stochastic": up with probability
        equal to the fractional position between the neighbours, decided by
        ``u < frac`` with ``u`` uniform in [0, 1).
        """
        a = torch.clamp(a, max=self.max)  # keeps NaN
        sp = self.spacing(a)
        idx = a / sp  # exact: sp is a power of two
        lo = torch.floor(idx)
        frac = idx - lo  # exact
        if mode == "nearest":
            odd = torch.remainder(lo, 2.0) == 1.0
            up = (frac > 0.5) | ((frac == 0.5) & odd)
        elif mode == "up":
            up = frac > 0.0
        elif mode == "stochastic":
            if u is None:
                raise ValueError("stochastic rounding needs uniform random numbers u")
            up = u < frac
        else:
            raise ValueError(f"unknown rounding mode {mode!r}")
        q = (lo + up.to(lo.dtype)) * sp
        return torch.clamp(q, max=self.max)


E2M1 = Grid("e2m1", max=6.0, mbits=1, emin=0)
E4M3 = Grid("e4m3", max=448.0, mbits=3, emin=-6)
FP16 = Grid("fp16", max=65504.0, mbits=10, emin=-14)
INT4 = Grid("int4", max=7.0, mbits=None)

# E2M1 magnitudes by 3-bit code, and the code of each magnitude (index = 2 * magnitude).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_CODE_OF_TWICE = {int(2 * v): c for c, v in enumerate(E2M1_VALUES)}


def _lut(values, dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# Elements: value <-> code
# ---------------------------------------------------------------------------

ELEMENT_GRIDS = {"e2m1": E2M1, "int4": INT4, "e4m3": E4M3}
ELEMENT_BITS = {"e2m1": 4, "int4": 4, "e4m3": 8, "bf16": 16}
# The code an element takes where its micro-group is not finite (decoding gives NaN
# through the scale anyway; e4m3 has a NaN code of its own).
ELEMENT_NONFINITE_CODE = {"e2m1": 0, "int4": 0, "e4m3": 0x7F}


def encode_element(q: torch.Tensor, negative: torch.Tensor, element: str) -> torch.Tensor:
    """Codes (int32, one per value) of on-grid magnitudes ``q`` with sign ``negative``.

    The sign is that of the input value, so -0.1 becomes E2M1 -0 (code 8), as the
    OCP rounding and torchao do.
    """
    if element == "e2m1":
        lut = [0] * 13
        for twice, code in _E2M1_CODE_OF_TWICE.items():
            lut[twice] = code
        mag = _lut(lut, torch.int32, q.device)[(q * 2).to(torch.int64)]
        return mag | (negative.to(torch.int32) << 3)
    if element == "int4":
        signed = torch.where(negative, -q, q).to(torch.int32)
        return signed & 0xF
    if element == "e4m3":
        signed = torch.where(negative, -q, q)
        return signed.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    raise ValueError(f"unknown element format {element!r}")


def decode_element(codes: torch.Tensor, element: str) -> torch.Tensor:
    """float32 values of integer codes (e2m1 code 8 and e4m3 0x80: -0.0)."""
    codes = codes.to(torch.int64)
    if element == "e2m1":
        table = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]  # -0.0 at code 8
        return _lut(table, torch.float32, codes.device)[codes]
    if element == "int4":
        return ((codes ^ 8) - 8).to(torch.float32)
    if element == "e4m3":
        return codes.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    raise ValueError(f"unknown element format {element!r}")


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte: element 2i in the low nibble, 2i+1 in the high one."""
    pairs = codes.to(torch.uint8).view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    low = packed & 0xF
    high = packed >> 4
    return torch.stack([low, high], dim=-1).view(-1)


# ---------------------------------------------------------------------------
# Scales: float32 value -> stored scale -> float32 value
# ---------------------------------------------------------------------------

SCALE_BYTES = {"e4m3": 1, "e8m0": 1, "fp16": 2, "none": 0}
SCALE_MAX = {"e4m3": 448.0, "fp16": 65504.0}
# Smallest stored scale: the format's smallest normal (torchao's clamp for e4m3), so a
# scale is never zero and never a low-precision subnormal.
SCALE_MIN = {"e4m3": 2.0**-6, "fp16": 2.0**-14}
_SCALE_GRIDS = {"e4m3": E4M3, "fp16": FP16}
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF


def encode_scale(t: torch.Tensor, fmt: str, rule: str) -> torch.Tensor:
    """Round the wanted scales ``t`` (float32, >= 0) to ``fmt`` with ``rule``.

    Returns the stored form: uint8 for e4m3, float16 for fp16.  NaN gives the
    format's NaN.  (e8m0 scales are chosen from block maxima: see encode_e8m0.)
    """
    grid = _SCALE_GRIDS[fmt]
    q = grid.round(torch.clamp(t, min=SCALE_MIN[fmt]), rule)
    q = torch.where(torch.isnan(t), torch.nan, q)
    if fmt == "e4m3":
        return q.to(torch.float8_e4m3fn).view(torch.uint8)
    return q.to(torch.float16)


def decode_scale(stored: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "e4m3":
        return stored.view(torch.float8_e4m3fn).to(torch.float32)
    if fmt == "fp16":
        return stored.to(torch.float32)
    if fmt == "e8m0":
        b = stored.to(torch.int32)
        value = pow2(b.clamp(1, 254) - 127)
        value = torch.where(b == 0, 2.0**-127, value)  # the one subnormal scale
        return torch.where(b == E8M0_NAN, torch.nan, value)
    raise ValueError(f"unknown scale format {fmt!r}")


def encode_e8m0(block_amax: torch.Tensor, element_max: float, rule: str) -> torch.Tensor:
    """OCP MX scale byte of each block from its largest magnitude.

    rule "floor" (the OCP rule, torchao's default): 2**(floor(log2 amax) - emax_elem),
    where emax_elem = floor(log2 element_max) (2 for E2M1); values above
    element_max then saturate.  rule "up": the smallest power of two with
    amax / scale <= element_max, so nothing saturates.
    """
    emax_elem = math.floor(math.log2(element_max))
    k = exponent_bits(block_amax) - emax_elem
    if rule == "up":
        over = block_amax > element_max * pow2(k.clamp(-126, 127))
        k = k + over.to(k.dtype)
    elif rule != "floor":
        raise ValueError(f"unknown e8m0 scale rule {rule!r}")
    byte = (k.clamp(-127, 127) + 127).to(torch.uint8)
    return torch.where(torch.isnan(block_amax), torch.tensor(E8M0_NAN, dtype=torch.uint8), byte)
