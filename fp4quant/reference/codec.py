"""The pure-PyTorch reference codec: the numbers every kernel must reproduce bit for bit.

Quantization of one message (docs/format.md has the same steps as a spec):

 1. Flatten, cast to float32, zero-pad to a multiple of ``config.block``.
 2. Coarse blocks (a group, or the whole message for coarse_scale="tensor") are
    multiplied by 2**-e, e = floor(log2(largest finite |x| in the block)), clamped to
    [-126, 126].  This is exact and changes no result in the normal range; it keeps
    the FWHT from overflowing on huge inputs and the scales normal on tiny ones.
 3. FWHT (optional): signs, two-level butterflies, times fp32(1/sqrt(group)).
 4. Coarse scale c = (largest finite |y| in the block) / (element_max * micro_scale_max).
 5. Micro-scale m = round_scale(((largest |y| in the micro-group) / element_max) / c).
 6. r = (1/c) / m (or 1/m, or 1/c), and v = y * r; where c == 0 (an all-zero block) r = 0.
 7. Codes: round |v| onto the element grid (nearest-even, or stochastic with the
    counter-based uniforms of fp4quant.format.random), saturating; sign from v.
 8. A micro-group holding NaN or +-Inf gets a NaN micro-scale (and NaN codes for
    e4m3 elements), so it decodes to NaN; the stored coarse scale is c * 2**e.

Steps 5-6 follow torchao's NVFP4 arithmetic, so the nvfp4 preset matches it bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..format.config import QuantConfig
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


def quantize(x: torch.Tensor, config: QuantConfig, seed: int = 0, offset: int = 0) -> Packed:
    """Compress ``x`` (float32/bfloat16/float16, any shape) under ``config``.

    ``seed`` and ``offset`` select the random stream of stochastic rounding
    (unused with rounding="nearest").
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize expects a torch.Tensor, got {type(x).__name__}")
    check_float_dtype(x.dtype)
    check_seed(seed)
    check_seed(offset, "offset")
    x = x.detach()
    if not config.compressed:
        codes = x.reshape(-1).to(torch.bfloat16).contiguous().view(torch.uint8)
        return Packed(codes, _EMPTY_U8.to(x.device), _EMPTY_F32.to(x.device), x.shape, x.dtype, config)
    return encode(x.reshape(-1).to(torch.float32), x.shape, x.dtype, config, seed, offset, transform=True)


def encode(
    flat: torch.Tensor, shape, dtype: torch.dtype, config: QuantConfig, seed: int, offset: int, transform: bool
) -> Packed:
    """Steps 1-8 of the module doc on one float32 message; ``transform=False`` skips the
    FWHT (the values are already in the transformed domain, as in a reduced all-reduce shard)."""
    device = flat.device
    empty_u8, empty_f32 = _EMPTY_U8.to(device), _EMPTY_F32.to(device)
    lay = layout(flat.numel(), config)
    if lay.padded == 0:
        micro_dtype = torch.float16 if config.micro_scale == "fp16" else torch.uint8
        return Packed(empty_u8, torch.empty(0, dtype=micro_dtype, device=device), empty_f32, shape, dtype, config)
    flat = F.pad(flat, (0, lay.padded - lay.numel))
    M = config.micro_group

    # 2. power-of-two normalization of each coarse block
    n_rows = _coarse_rows(flat, config)
    if n_rows:
        rows = flat.view(n_rows, -1)
        e = _normalizing_exponent(_finite_amax(rows))
        flat = (rows * pow2(-e)[:, None]).view(-1)

    # 3. FWHT
    y = flat
    if config.fwht == "two_level" and transform:
        G = config.group
        blocks = flat.view(-1, G)
        if config.fwht_seed is not None:
            blocks = blocks * fwht_signs(G, config.fwht_seed, device)
        y = (two_level_transform(blocks, G, M) * inv_sqrt(G)).view(-1)

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
        t = micro_amax / element_max
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
    coarse_scales = (c * pow2(e)) if n_rows else empty_f32
    return Packed(codes, micro_scales, coarse_scales, shape, dtype, config)


def dequantize(packed: Packed) -> torch.Tensor:
    """The tensor a Packed stands for, in its original shape and dtype."""
    config, shape, dtype = packed.config, packed.shape, packed.dtype
    if not config.compressed:
        return packed.codes.view(torch.bfloat16).to(dtype).reshape(shape)
    if packed.layout.padded == 0:
        return torch.empty(shape, dtype=dtype, device=packed.device)
    return _saturating_cast(decode(packed, transform=True), dtype).reshape(shape)


def _saturating_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Decoding arithmetic may round just past the output's finite range; saturate
    # (NaN stays NaN: non-finite inputs are carried by NaN scales, never by infinities).
    finfo = torch.finfo(dtype)
    return torch.clamp(x, -finfo.max, finfo.max).to(dtype)


def decode(packed: Packed, transform: bool) -> torch.Tensor:
    """The float32 values of a compressed message: ``numel`` of them, padding dropped.

    ``transform=False`` leaves FWHT configs in the transformed domain, ``code * m * c``,
    and returns all ``padded`` values (padding is not zero there).
    """
    config = packed.config
    lay = packed.layout
    M = config.micro_group
    codes = packed.codes
    if config.element in ("e2m1", "int4"):
        codes = unpack_nibbles(codes)
    q = decode_element(codes, config.element).view(-1, M)
    n_micro = q.shape[0]

    n_rows = packed.coarse_scales.numel()
    c = packed.coarse_scales.to(torch.float32)
    inverse = config.fwht == "two_level" and transform
    # Keep the transformed domain in range: decode against c * 2**-E, multiply by 2**E last.
    normalize = n_rows and inverse
    if normalize:
        E = _normalizing_exponent(c)
        c = c * pow2(-E)
    if n_rows:
        c_micro = c.repeat_interleave(n_micro // n_rows)
    if config.micro_scale != "none":
        s = decode_scale(packed.micro_scales, config.micro_scale)
        if n_rows:
            s = s * c_micro
    else:
        s = c_micro
    z = (q * s[:, None]).view(-1)

    if inverse:
        G = config.group
        z = two_level_transform(z.view(-1, G), G, M) * inv_sqrt(G)
        if config.fwht_seed is not None:
            z = z * fwht_signs(G, config.fwht_seed, z.device)
        z = z.view(-1)
    if normalize:
        z = (z.view(n_rows, -1) * pow2(E)[:, None]).view(-1)
    return z[: lay.numel] if transform else z


# --- batched messages: the entry points the kernels and the collectives share -----------


def _check_config(config: QuantConfig) -> None:
    if not config.compressed:
        raise ValueError("the bf16 preset is no compression: send the tensor itself")


def row_offset(config: QuantConfig, n: int, offset: int, row: int) -> int:
    """Stochastic-rounding counter of row ``row``: the rows' padded values follow each other."""
    return offset + row * layout(n, config).padded


def quantize_rows(x: torch.Tensor, config: QuantConfig, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """Each row of the (rows, n) tensor ``x`` as one message: uint8 (rows, nbytes(n))."""
    _check_config(config)
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


def dequantize_rows(msgs: torch.Tensor, n: int, config: QuantConfig, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of quantize_rows: (rows, n) of ``dtype``."""
    _check_config(config)
    check_float_dtype(dtype)
    packs = _messages(msgs, n, config, dtype)
    out = torch.empty(len(packs), n, dtype=dtype, device=msgs.device)
    for r, p in enumerate(packs):
        out[r] = _saturating_cast(decode(p, transform=True), dtype) if n else out[r]
    return out


def dequantize_reduce(
    msgs: torch.Tensor,
    n: int,
    config: QuantConfig,
    dtype: torch.dtype,
    requantize: bool,
    seed: int = 0,
    offset: int = 0,
) -> torch.Tensor:
    """Sum W messages of the same layout, the core of a compressed all-reduce.

    The messages are decoded in the transformed domain (``code * m * c``) and summed
    in float32 in row order (``((m0 + m1) + m2) + ...``).  With ``requantize`` the sum is
    compressed again without a second FWHT (it is already transformed) and returned
    as one message, uint8 (nbytes(n),); otherwise it is inverse-transformed and
    returned as (n,) ``dtype``.
    """
    _check_config(config)
    check_float_dtype(dtype)
    packs = _messages(msgs, n, config, dtype)
    if not packs:
        raise ValueError("dequantize_reduce needs at least one message")
    if not n:
        return msgs.new_empty(0) if requantize else torch.empty(0, dtype=dtype, device=msgs.device)
    total = decode(packs[0], transform=False)
    for p in packs[1:]:
        total = total + decode(p, transform=False)
    if requantize:
        return encode(total, (n,), dtype, config, seed, offset, transform=False).to_bytes()
    if config.fwht == "two_level":
        total = inverse_transform(total, config)
    return _saturating_cast(total[:n], dtype)


def inverse_transform(z: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """Inverse FWHT (then the signs) of a padded transformed-domain float32 message."""
    G = config.group
    z = two_level_transform(z.view(-1, G), G, config.micro_group) * inv_sqrt(G)
    if config.fwht_seed is not None:
        z = z * fwht_signs(G, config.fwht_seed, z.device)
    return z.reshape(-1)
