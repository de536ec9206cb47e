"""Loading fp4quant._C: build provenance check, fake kernels, and what is available.

Importing fp4quant never fails for want of the extension: when it is missing, built
for another torch, or disabled (FP4QUANT_NO_EXT=1 at build time), the ops run the
pure-PyTorch reference and one warning says why.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import warnings
from pathlib import Path

import torch

from ..format.packed import layout
from .codes import from_codes

BUILD_INFO = Path(__file__).resolve().parent.parent / "_build_info.json"


class NativeUnavailableWarning(UserWarning):
    """fp4quant's native kernels could not be used; the reference runs instead."""


def _library_mismatch(info: dict) -> str | None:
    """Why the build record does not describe the library that would load, or None."""
    spec = importlib.util.find_spec("fp4quant._C")
    if spec is None or not spec.origin:
        return "fp4quant._C is missing (the build record exists, the library does not); rebuild with " \
               "`pip install --no-build-isolation -e .`"
    library = Path(spec.origin)
    if "library_sha256" in info and hashlib.sha256(library.read_bytes()).hexdigest() != info["library_sha256"]:
        return (f"{library.name} is not the library that {BUILD_INFO.name} describes (its checksum differs: a "
                "failed or interrupted build?); rebuild with `pip install --no-build-isolation -e .`")
    return None


def _load():
    """(module, build info, reason it is unavailable or None)."""
    if os.environ.get("FP4QUANT_BACKEND") == "reference":
        return None, {}, "FP4QUANT_BACKEND=reference"
    try:
        info = json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None, {}, "fp4quant was installed without its extension (no fp4quant/_build_info.json)"
    if info.get("torch") != torch.__version__:
        return None, info, (
            f"fp4quant._C was built for torch {info.get('torch')} but torch {torch.__version__} is running; "
            "rebuild with `pip install --no-build-isolation -e .`"
        )
    mismatch = _library_mismatch(info)
    if mismatch:
        return None, info, mismatch
    try:
        from .. import _C  # noqa: F401  (registers torch.ops.fp4quant.*)
    except ImportError as exc:
        return None, info, f"fp4quant._C failed to load ({exc}); rebuild with `pip install --no-build-isolation -e .`"
    return _C, info, None


module, build_info, unavailable_reason = _load()
if unavailable_reason and os.environ.get("FP4QUANT_BACKEND") != "reference":
    warnings.warn(
        f"fp4quant: native kernels unavailable, using the pure-PyTorch reference: {unavailable_reason}",
        NativeUnavailableWarning,
        stacklevel=2,
    )


def has_native(device: torch.device) -> bool:
    if module is None:
        return False
    if device.type == "cpu":
        return True
    return device.type == "cuda" and bool(module.with_cuda)


if module is not None:

    @torch.library.register_fake("fp4quant::quantize")
    def _quantize_fake(x, config, signs, seed, offset):
        lay = layout(x.shape[1], from_codes(config))
        return x.new_empty((x.shape[0], lay.nbytes), dtype=torch.uint8)

    @torch.library.register_fake("fp4quant::dequantize")
    def _dequantize_fake(msgs, n, config, signs, dtype, saturate=True):
        return msgs.new_empty((msgs.shape[0], n), dtype=dtype)

    @torch.library.register_fake("fp4quant::dequantize_into")
    def _dequantize_into_fake(msgs, n, config, signs, saturate, out):
        return None

    @torch.library.register_fake("fp4quant::dequantize_reduce")
    def _dequantize_reduce_fake(msgs, n, config, signs, dtype, requantize, seed, offset):
        if requantize:
            return msgs.new_empty((layout(n, from_codes(config)).nbytes,), dtype=torch.uint8)
        return msgs.new_empty((n,), dtype=dtype)
