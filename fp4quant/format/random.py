"""Counter-based random numbers that every implementation reproduces bit for bit.

Stochastic rounding and the FWHT's random signs must give the same bits in the
reference, the CPU kernels and the CUDA kernels, on every rank.  A counter-based
hash does that without any generator state: the random word of element ``i`` of a
call with ``(seed, offset)`` is

    key = mix32(seed_lo ^ mix32(seed_hi ^ 0x9E3779B9))
    c   = offset + i                      (64-bit counter)
    h   = mix32(lo32(c) ^ mix32(hi32(c) ^ key))
    u   = (h >> 8) * 2**-24               (uniform in [0, 1), 24 bits, exact in float32)

``mix32`` is Chris Wellons' "lowbias32" integer hash (a bijection of 32-bit words).
The FWHT's sign of position ``j`` is ``-1`` where bit 0 of
``mix32(j ^ mix32(seed_lo ^ mix32(seed_hi ^ 0x85EBCA6B)))`` is set.
"""

from __future__ import annotations

from functools import lru_cache

import torch

MASK32 = 0xFFFFFFFF
MIX_MUL1 = 0x21F0AAAD
MIX_MUL2 = 0x735A2D97
ROUNDING_SALT = 0x9E3779B9
SIGN_SALT = 0x85EBCA6B


def mix32_int(x: int) -> int:
    """lowbias32 on a Python int (host side)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * MIX_MUL1) & MASK32
    x ^= x >> 15
    x = (x * MIX_MUL2) & MASK32
    x ^= x >> 15
    return x


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 for x in [0, 2**32) held in int64, in two 16-bit halves of c
    # so that no intermediate overflows int64.
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int64 tensor holding 32-bit words."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL2)
    x = x ^ (x >> 15)
    return x


def check_seed(seed: int, what: str = "seed") -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise ValueError(f"{what} must be an integer in [0, 2**64), got {seed!r}")
    return seed


def stream_key(seed: int, salt: int = ROUNDING_SALT) -> int:
    """The 32-bit key of a random stream."""
    check_seed(seed)
    return mix32_int((seed & MASK32) ^ mix32_int((seed >> 32) ^ salt))


def uniform(n: int, seed: int, offset: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The float32 uniforms of counters ``offset .. offset + n - 1`` (see module doc)."""
    check_seed(offset, "offset")
    key = stream_key(seed)
    counter = torch.arange(n, dtype=torch.int64, device=device)
    lo = (counter + (offset & MASK32)) & MASK32
    carry = (counter + (offset & MASK32)) >> 32
    hi = (carry + (offset >> 32)) & MASK32
    h = mix32(lo ^ mix32(hi ^ key))
    return (h >> 8).to(torch.float32) * 2.0**-24


@lru_cache(maxsize=64)
def _signs_cpu(n: int, seed: int) -> torch.Tensor:
    key = stream_key(seed, SIGN_SALT)
    bits = mix32(torch.arange(n, dtype=torch.int64) ^ key) & 1
    return (1 - 2 * bits).to(torch.float32)


def fwht_signs(n: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The +-1 float32 signs applied before an FWHT of size ``n`` (shared by all ranks)."""
    return _signs_cpu(n, seed).to(device, copy=True)
