"""The codec's operations, dispatched to the native kernels (fp4quant._C: C++ on CPUs,
CUDA on GPUs) where they exist, to the pure-PyTorch reference otherwise.  Both give the
same bytes; the reference is the oracle the kernels are tested against.

Messages are rows: ``quantize_rows`` turns each row of a (rows, n) tensor into one wire
message (docs/format.md), which is what the collectives send to each rank.
"""

from __future__ import annotations

import torch

from ..format.config import QuantConfig, as_config
from ..format.packed import Packed, check_float_dtype
from ..format.random import check_seed, fwht_signs
from ..reference import codec as reference
from . import _native
from .codes import signed64, to_codes

__all__ = ["backend", "dequantize", "dequantize_reduce", "dequantize_rows", "extension", "quantize", "quantize_rows"]

_SIGNS: dict[tuple[int, int, str], torch.Tensor] = {}


def backend(device: torch.device | str = "cpu") -> str:
    """"native" or "reference": what runs the ops for tensors on ``device``."""
    return "native" if _native.has_native(torch.device(device)) else "reference"


def extension() -> tuple[object | None, dict, str | None]:
    """The native extension: (its module or None, its build record, why it is not in use or None)."""
    return _native.module, _native.build_info, _native.unavailable_reason


def _signs(config: QuantConfig, device: torch.device) -> torch.Tensor | None:
    if config.fwht == "none" or config.fwht_seed is None:
        return None
    key = (config.group, config.fwht_seed, str(device))
    if key not in _SIGNS:  # a handful of (group, seed, device) combinations per process
        _SIGNS[key] = fwht_signs(config.group, config.fwht_seed, device)
    return _SIGNS[key]


def _check(config: QuantConfig | str, seed: int, offset: int) -> QuantConfig:
    """The config (a QuantConfig or a preset name) of a compressed op, checked with its seeds."""
    config = as_config(config)
    if not config.compressed:
        raise ValueError("the bf16 preset is no compression: send the tensor itself")
    check_seed(seed)
    check_seed(offset, "offset")
    return config


def quantize_rows(x: torch.Tensor, config: QuantConfig | str, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """Each row of the (rows, n) float tensor ``x`` as one message: uint8 (rows, nbytes(n)).

    Stochastic rounding: row r's values use the counters ``offset + r * padded + i``.
    """
    config = _check(config, seed, offset)
    check_float_dtype(x.dtype)
    if x.dim() != 2:
        raise ValueError(f"quantize_rows needs a 2-D (rows, n) tensor, got shape {tuple(x.shape)}")
    if backend(x.device) == "reference":
        return reference.quantize_rows(x, config, seed, offset)
    return torch.ops.fp4quant.quantize(x, to_codes(config), _signs(config, x.device), signed64(seed), signed64(offset))


def dequantize_rows(
    msgs: torch.Tensor, n: int, config: QuantConfig | str, dtype: torch.dtype, saturate: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(rows, nbytes(n)) messages -> (rows, n) values of ``dtype``.  Values past the dtype's
    range saturate; with ``saturate=False`` (messages that hold sums) they become +-inf.
    ``out``: a contiguous (rows, n) tensor of ``dtype`` on the messages' device to write them
    into (returned): no allocation, and no copy where the values are wanted in place."""
    config = _check(config, 0, 0)
    check_float_dtype(dtype, "dtype")
    reference.check_messages(msgs, n, config)
    if out is not None and (out.dtype != dtype or out.device != msgs.device or not out.is_contiguous()
                            or tuple(out.shape) != (msgs.shape[0], n)):
        raise ValueError(f"dequantize_rows: out must be a contiguous {(msgs.shape[0], n)} {dtype} tensor on "
                         f"{msgs.device}, got {'' if out.is_contiguous() else 'a non-contiguous '}"
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if backend(msgs.device) == "reference":
        vals = reference.dequantize_rows(msgs, n, config, dtype, saturate)
        return vals if out is None else out.copy_(vals)
    codes, signs = to_codes(config), _signs(config, msgs.device)
    if out is None:
        return torch.ops.fp4quant.dequantize(msgs, n, codes, signs, dtype, bool(saturate))
    torch.ops.fp4quant.dequantize_into(msgs, n, codes, signs, bool(saturate), out)
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
    """Sum (world, nbytes(n)) messages in FP32 in the transformed domain (row order); return
    the sum re-quantized as one message (``requantize``) or as (n,) values of ``dtype``, where
    a sum past the dtype's range is +-inf (as an uncompressed sum; one message saturates)."""
    config = _check(config, seed, offset)
    check_float_dtype(dtype, "dtype")
    if backend(msgs.device) == "reference":
        return reference.dequantize_reduce(msgs, n, config, dtype, requantize, seed, offset)
    reference.check_messages(msgs, n, config)
    if msgs.shape[0] == 0:
        raise ValueError("dequantize_reduce needs at least one message")
    return torch.ops.fp4quant.dequantize_reduce(
        msgs, n, to_codes(config), _signs(config, msgs.device), dtype, requantize, signed64(seed), signed64(offset)
    )


def quantize(x: torch.Tensor, config: QuantConfig | str, seed: int = 0, offset: int = 0) -> Packed:
    """One tensor (any shape) as one message, under a QuantConfig or a preset name."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize expects a torch.Tensor, got {type(x).__name__}")
    config = as_config(config)
    check_float_dtype(x.dtype)
    if not config.compressed or backend(x.device) == "reference" or x.numel() == 0:
        return reference.quantize(x, config, seed, offset)
    msg = quantize_rows(x.detach().reshape(1, -1), config, seed, offset)[0]
    return Packed.from_bytes(msg, x.shape, x.dtype, config)


def dequantize(packed: Packed) -> torch.Tensor:
    """The tensor a Packed stands for, in its original shape and dtype."""
    config = packed.config
    if not config.compressed or backend(packed.device) == "reference" or packed.numel == 0:
        return reference.dequantize(packed)
    out = dequantize_rows(packed.to_bytes()[None], packed.numel, config, packed.dtype)
    return out.reshape(packed.shape)
