"""The pure-PyTorch reference codec: the numbers every kernel must reproduce bit for bit.

Quantization of one message (docs/format.md has the same steps as a spec):

 1. Flatten, cast to float32, zero-pad to a multiple of ``config.block``.
 2. Coarse blocks (a group, or the whole message for coarse_scale="tensor") are
    multiplied by 2**-e, e = floor(log2(largest finite |x| in the block)), clamped to
    [-126, 126].  This is exact and changes no result in the normal range; it keeps
    the FWHT from overflowing on huge inputs and the scales normal on tiny ones.
    Without a coarse scale, FWHT groups are normalized the same way and multiplied by
    2**e again after the transform (finite values saturating at the float32 maximum).
 3. FWHT (optional): signs, two-level butterflies, times fp32(1/sqrt(group)).
 4. Coarse scale c = (largest finite |y| in the block) / (element_max * micro_scale_max).
 5. Micro-scale m = round_scale(((largest |y| in the micro-group) / element_max) / c).
 6. r = (1/c) / m (or 1/m, or 1/c), and v = y * r; where c == 0 (an all-zero block) r = 0.
 7. Codes: round |v| onto the element grid (nearest-even, or stochastic with the
    counter-based uniforms of fp4quant.format.random), saturating; sign from v.
 8. A micro-group holding NaN or +-Inf gets a NaN micro-scale (and NaN codes for
    e4m3 elements), so it decodes to NaN; the stored coarse scale is c * 2**e.

Decoding works block by block against 2**-E (E from the block's coarse scale), so that
neither the inverse FWHT nor a sum of messages overflows; one message's values saturate
at the output dtype's maximum, a sum's overflow to +-inf (docs/format.md, "Decoding").

Zero signs: without the FWHT, an e2m1 / e4m3 value keeps its sign through a round trip,
-0.0 and negatives that round to zero included (they decode to -0.0, as a float cast
gives); int4 has no negative zero (+0.0).  With the FWHT a decoded value is a signed sum
over its group, and an exact zero has the sign the inverse transform's IEEE arithmetic
gives, not the input's: the rotation keeps no per-value sign of a zero (its butterflies
map different zero-sign patterns onto the same one).  Sums (dequantize_reduce) add in
IEEE float32: a sum of zeros is -0.0 only when every term is (-0 + +0 = +0).  Every kernel follows these steps, so zero signs, too,
are the same bits everywhere.

Steps 5-6 follow torchao's NVFP4 arithmetic, so the nvfp4 preset matches it bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..format.config import QuantConfig, as_config
from ..format.elements import (
    ELEMENT_GRIDS,
    ELEMENT_NONFINITE_CODE,
    decode_element,
    decode_scale,
    encode_e8m0,
    encode_element,
    encode_scale,
    exponent_bits,
    pack_nibbles,
    pow2,
    unpack_nibbles,
)
from ..format.packed import Packed, check_float_dtype, layout
from ..format.random import check_seed, fwht_signs, uniform
from .fwht import inv_sqrt, two_level_transform

_EMPTY_U8 = torch.empty(0, dtype=torch.uint8)
_EMPTY_F32 = torch.empty(0, dtype=torch.float32)
F32_MAX = torch.finfo(torch.float32).max


def _coarse_rows(flat: torch.Tensor, config: QuantConfig) -> int:
    """Rows of the (rows, -1) view whose rows are coarse blocks (0: no coarse scale)."""
    if config.coarse_scale == "group":
        return flat.numel() // config.group
    if config.coarse_scale == "tensor":
        return 1
    return 0


def _finite_amax(rows: torch.Tensor) -> torch.Tensor:
    """Largest finite magnitude of each row (0 for a row with none)."""
    a = rows.abs()
    return torch.where(torch.isfinite(a), a, 0.0).amax(dim=1)


def _normalizing_exponent(amax: torch.Tensor) -> torch.Tensor:
    return exponent_bits(amax).clamp(-126, 126)


def _scale_rows(rows: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """Row i times 2**exponent[i], finite values saturating at +-F32_MAX (the way back from
    a normalized FWHT group without a coarse scale, whose format cannot hold more anyway)."""
    out = rows * pow2(exponent)[:, None]
    over = torch.isfinite(rows) & ~torch.isfinite(out)
    return torch.where(over, torch.copysign(torch.full_like(rows, F32_MAX), rows), out)


def quantize(x: torch.Tensor, config: QuantConfig | str, seed: int = 0, offset: int = 0) -> Packed:
    """Compress ``x`` (float32/bfloat16/float16, any shape) under ``config`` (or a preset name).

    ``seed`` and ``offset`` select the random stream of stochastic rounding
    (unused with rounding="nearest").
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize expects a torch.Tensor, got {type(x).__name__}")
    config = as_config(config)
    check_float_dtype(x.dtype)
    check_seed(seed)
    check_seed(offset, "offset")
    x = x.detach()
    if not config.compressed:
        codes = x.reshape(-1).to(torch.bfloat16).contiguous().view(torch.uint8)
        return Packed(codes, _EMPTY_U8.to(x.device), _EMPTY_F32.to(x.device), x.shape, x.dtype, config)
    return encode(x.reshape(-1).to(torch.float32), x.shape, x.dtype, config, seed, offset, transform=True)


def encode(
    flat: torch.Tensor,
    shape,
    dtype: torch.dtype,
    config: QuantConfig,
    seed: int,
    offset: int,
    transform: bool,
    exponent: torch.Tensor | None = None,
    element_target: float | None = None,
) -> Packed:
    """Steps 1-8 of the module doc on one float32 message; ``transform=False`` skips the
    FWHT (the values are already in the transformed domain, as in a reduced all-reduce shard).

    ``exponent``: the values are a sum normalized by 2**-exponent per block (dequantize_reduce):
    the stored coarse scales are multiplied by 2**exponent, or, without a coarse scale, the
    values are first multiplied by it (saturating).

    ``element_target``: the element value a micro-group's largest magnitude is scaled to
    (default: the element maximum); fp4quant.reference.scale_select picks per micro-group."""
    device = flat.device
    empty_u8, empty_f32 = _EMPTY_U8.to(device), _EMPTY_F32.to(device)
    lay = layout(flat.numel(), config)
    if lay.padded == 0:
        micro_dtype = torch.float16 if config.micro_scale == "fp16" else torch.uint8
        return Packed(empty_u8, torch.empty(0, dtype=micro_dtype, device=device), empty_f32, shape, dtype, config)
    flat = F.pad(flat, (0, lay.padded - lay.numel))
    M, G = config.micro_group, config.group
    fwht = config.fwht == "two_level" and transform

    # 2. power-of-two normalization of each coarse block (without one: of each FWHT group)
    n_rows = _coarse_rows(flat, config)
    if n_rows:
        rows = flat.view(n_rows, -1)
        e = _normalizing_exponent(_finite_amax(rows))
        flat = (rows * pow2(-e)[:, None]).view(-1)
    elif fwht:
        groups = flat.view(-1, G)
        e_group = _normalizing_exponent(_finite_amax(groups))
        flat = (groups * pow2(-e_group)[:, None]).view(-1)
    elif exponent is not None:
        flat = _scale_rows(flat.view(exponent.numel(), -1), exponent).view(-1)

    # 3. FWHT
    y = flat
    if fwht:
        blocks = flat.view(-1, G)
        if config.fwht_seed is not None:
            blocks = blocks * fwht_signs(G, config.fwht_seed, device)
        y = two_level_transform(blocks, G, M) * inv_sqrt(G)
        if not n_rows:
            y = _scale_rows(y, e_group)
        y = y.view(-1)

    micro = y.view(-1, M)
    finite = torch.isfinite(micro).all(dim=1)
    micro_amax = micro.abs().amax(dim=1)
    micro_per_row = micro.shape[0] // n_rows if n_rows else 0

    # 4. coarse scale (normalized domain)
    if n_rows:
        c = _finite_amax(y.view(n_rows, -1)) / config.coarse_divisor
        c_micro = c.repeat_interleave(micro_per_row)

    # 5. micro-scale
    element_max = config.element_max
    if config.micro_scale in ("e4m3", "fp16"):
        t = micro_amax / (element_max if element_target is None else element_target)
        if n_rows:
            t = torch.where(c_micro == 0, 0.0, t / c_micro)
        t = torch.where(finite, t, torch.nan)
        micro_scales = encode_scale(t, config.micro_scale, config.scale_round)
        m = decode_scale(micro_scales, config.micro_scale)
    elif config.micro_scale == "e8m0":
        micro_scales = encode_e8m0(torch.where(finite, micro_amax, torch.nan), element_max, config.scale_round)
        m = decode_scale(micro_scales, "e8m0")
    else:
        micro_scales = empty_u8

    # 6. reciprocal scale per micro-group
    if n_rows and config.micro_scale != "none":
        r = torch.where(c_micro == 0, 0.0, (1.0 / c_micro) / m)
    elif n_rows:
        r = torch.where(c_micro == 0, 0.0, 1.0 / c_micro)
    else:
        r = 1.0 / m
    v = micro * r[:, None]

    # 7. element codes
    u = None
    if config.rounding == "stochastic":
        u = uniform(lay.padded, seed, offset, device).view(-1, M)
    grid = ELEMENT_GRIDS[config.element]
    mode = "stochastic" if config.rounding == "stochastic" else "nearest"
    q = grid.round(v.abs(), mode, u)
    q = torch.where(finite[:, None], q, 0.0)
    codes = encode_element(q, torch.signbit(v), config.element)

    # 8. non-finite micro-groups
    codes = torch.where(finite[:, None], codes, ELEMENT_NONFINITE_CODE[config.element]).view(-1)
    if config.element in ("e2m1", "int4"):
        codes = pack_nibbles(codes)
    else:
        codes = codes.to(torch.uint8)
    coarse_scales = empty_f32
    if n_rows:
        coarse_scales = c * pow2(e)
        if exponent is not None:
            coarse_scales = coarse_scales * pow2(exponent)
    return Packed(codes, micro_scales, coarse_scales, shape, dtype, config)


# --- decoding ----------------------------------------------------------------------------


def block_exponents(packed: Packed) -> torch.Tensor | None:
    """E of each block a message is decoded against (docs/format.md, "Decoding"): per coarse
    block the normalizing exponent of its coarse scale; per FWHT group with e8m0 micro-scales
    and no coarse scale, that of its largest finite micro-scale; None where values need no
    normalization (e4m3 / fp16 micro-scales bound them)."""
    config = packed.config
    if packed.coarse_scales.numel():
        return _normalizing_exponent(packed.coarse_scales.contiguous())
    if config.fwht == "two_level" and config.micro_scale == "e8m0":
        m = decode_scale(packed.micro_scales, "e8m0").view(-1, config.group // config.micro_group)
        return _normalizing_exponent(_finite_amax(m))
    return None


def decode_normalized(packed: Packed, exponent: torch.Tensor | None) -> torch.Tensor:
    """All ``padded`` float32 values of a message in the transformed domain, divided by
    2**exponent per block: ``code * m * (c * 2**-E)`` (``code * (m * 2**-E)`` without a
    coarse scale, ``code * m`` when ``exponent`` is None)."""
    config = packed.config
    codes = packed.codes
    if config.element in ("e2m1", "int4"):
        codes = unpack_nibbles(codes)
    q = decode_element(codes, config.element).view(-1, config.micro_group)
    n_micro = q.shape[0]
    factor = None
    n_rows = packed.coarse_scales.numel()
    if n_rows:
        c = packed.coarse_scales.to(torch.float32)
        if exponent is not None:
            c = c * pow2(-exponent)
        factor = c.repeat_interleave(n_micro // n_rows)
    elif exponent is not None:
        factor = pow2(-exponent).repeat_interleave(n_micro // exponent.numel())
    if config.micro_scale != "none":
        s = decode_scale(packed.micro_scales, config.micro_scale)
        if factor is not None:
            s = s * factor
    else:
        s = factor
    return (q * s[:, None]).view(-1)


def finish(z: torch.Tensor, config: QuantConfig, exponent: torch.Tensor | None) -> torch.Tensor:
    """Normalized transformed-domain values -> values: inverse FWHT, then times 2**exponent."""
    if config.fwht == "two_level":
        z = inverse_transform(z, config)
    if exponent is not None:
        z = (z.view(exponent.numel(), -1) * pow2(exponent)[:, None]).view(-1)
    return z


def cast(x: torch.Tensor, dtype: torch.dtype, saturate: bool) -> torch.Tensor:
    """float32 -> ``dtype``, rounding to nearest.  ``saturate``: values past the dtype's finite
    range become its maximum (one message: the input was finite, the excess is quantization
    error); otherwise they overflow to +-inf as a cast does (a sum that overflows).  NaN stays."""
    if saturate:
        finfo = torch.finfo(dtype)
        x = torch.clamp(x, -finfo.max, finfo.max)
    return x.to(dtype)


def decode(packed: Packed) -> torch.Tensor:
    """The ``numel`` float32 values of one compressed message (before the cast to its dtype)."""
    exponent = block_exponents(packed)
    return finish(decode_normalized(packed, exponent), packed.config, exponent)[: packed.numel]


def dequantize(packed: Packed) -> torch.Tensor:
    """The tensor a Packed stands for, in its original shape and dtype."""
    config, shape, dtype = packed.config, packed.shape, packed.dtype
    if not config.compressed:
        return packed.codes.view(torch.bfloat16).to(dtype).reshape(shape)
    if packed.layout.padded == 0:
        return torch.empty(shape, dtype=dtype, device=packed.device)
    return cast(decode(packed), dtype, saturate=True).reshape(shape)


# --- batched messages: the entry points the kernels and the collectives share -----------


def _check_config(config: QuantConfig | str) -> QuantConfig:
    config = as_config(config)
    if not config.compressed:
        raise ValueError("the bf16 preset is no compression: send the tensor itself")
    return config


def row_offset(config: QuantConfig, n: int, offset: int, row: int) -> int:
    """Stochastic-rounding counter of row ``row``: the rows' padded values follow each other."""
    return offset + row * layout(n, config).padded


def quantize_rows(x: torch.Tensor, config: QuantConfig | str, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """Each row of the (rows, n) tensor ``x`` as one message: uint8 (rows, nbytes(n))."""
    config = _check_config(config)
    check_float_dtype(x.dtype)
    rows, n = x.shape
    out = torch.empty(rows, layout(n, config).nbytes, dtype=torch.uint8, device=x.device)
    for r in range(rows):  # rows are ranks: a handful
        packed = encode(x[r].to(torch.float32), (n,), x.dtype, config, seed, row_offset(config, n, offset, r), True)
        out[r] = packed.to_bytes()
    return out


def check_messages(msgs: torch.Tensor, n: int, config: QuantConfig) -> None:
    """ValueError unless msgs is uint8 (rows, nbytes(n)): rows messages of n values each."""
    nbytes = layout(n, config).nbytes
    if msgs.dtype != torch.uint8 or msgs.dim() != 2 or msgs.shape[1] != nbytes:
        raise ValueError(
            f"messages must be uint8 of shape (rows, {nbytes}) for n={n} under {config}, "
            f"got {msgs.dtype} {tuple(msgs.shape)}"
        )


def _messages(msgs: torch.Tensor, n: int, config: QuantConfig, dtype: torch.dtype) -> list[Packed]:
    check_messages(msgs, n, config)
    return [Packed.from_bytes(msgs[r], (n,), dtype, config) for r in range(msgs.shape[0])]


def dequantize_rows(
    msgs: torch.Tensor, n: int, config: QuantConfig | str, dtype: torch.dtype, saturate: bool = True
) -> torch.Tensor:
    """Inverse of quantize_rows: (rows, n) of ``dtype``.  ``saturate=False`` for messages that
    hold sums (the two-shot all-reduce's reduced shards): values past the dtype's range
    become +-inf, as in dequantize_reduce."""
    config = _check_config(config)
    check_float_dtype(dtype)
    packs = _messages(msgs, n, config, dtype)
    out = torch.empty(len(packs), n, dtype=dtype, device=msgs.device)
    for r, p in enumerate(packs):
        out[r] = cast(decode(p), dtype, saturate) if n else out[r]
    return out


def dequantize_reduce(
    msgs: torch.Tensor,
    n: int,
    config: QuantConfig | str,
    dtype: torch.dtype,
    requantize: bool,
    seed: int = 0,
    offset: int = 0,
) -> torch.Tensor:
    """Sum W messages of the same layout, the core of a compressed all-reduce.

    Each block is decoded against 2**-E, E the largest of the messages' block exponents,
    in the transformed domain (``code * m * (c * 2**-E)``), and summed in float32 in row
    order (``((m0 + m1) + m2) + ...``; zeros as IEEE adds them: -0.0 only if every term is
    -0.0).  With ``requantize`` the sum is compressed again
    without a second FWHT (it is already transformed) and returned as one message, uint8
    (nbytes(n),); otherwise it is inverse-transformed, multiplied by 2**E and returned as
    (n,) ``dtype``, where a sum past the dtype's range is +-inf (one message saturates).
    """
    config = _check_config(config)
    check_float_dtype(dtype)
    packs = _messages(msgs, n, config, dtype)
    if not packs:
        raise ValueError("dequantize_reduce needs at least one message")
    if not n:
        return msgs.new_empty(0) if requantize else torch.empty(0, dtype=dtype, device=msgs.device)
    exponents = [block_exponents(p) for p in packs]
    exponent = None if exponents[0] is None else torch.stack(exponents).amax(dim=0)
    total = decode_normalized(packs[0], exponent)
    for p in packs[1:]:
        total = total + decode_normalized(p, exponent)
    if requantize:
        return encode(total, (n,), dtype, config, seed, offset, transform=False, exponent=exponent).to_bytes()
    return cast(finish(total, config, exponent)[:n], dtype, saturate=len(packs) == 1)


def inverse_transform(z: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """Inverse FWHT (then the signs) of a padded transformed-domain float32 message."""
    G = config.group
    z = two_level_transform(z.view(-1, G), G, config.micro_group) * inv_sqrt(G)
    if config.fwht_seed is not None:
        z = z * fwht_signs(G, config.fwht_seed, z.device)
    return z.reshape(-1)
