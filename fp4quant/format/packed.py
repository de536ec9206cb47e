"""The wire format: Packed, and its one-buffer byte layout (docs/format.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import QuantConfig
from .elements import ELEMENT_BITS, SCALE_BYTES

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Layout:
    """Sizes of one message of ``numel`` values (all counts in entries, not bytes)."""

    numel: int
    padded: int  # values after zero padding to a multiple of config.block
    n_coarse: int  # FP32 coarse scales
    n_micro: int  # micro-scales
    micro_bytes: int  # bytes per micro-scale
    code_bytes: int  # bytes of element codes

    @property
    def coarse_nbytes(self) -> int:
        return 4 * self.n_coarse

    @property
    def micro_nbytes(self) -> int:
        return self.n_micro * self.micro_bytes

    @property
    def nbytes(self) -> int:
        return self.coarse_nbytes + self.micro_nbytes + self.code_bytes


def layout(numel: int, config: QuantConfig) -> Layout:
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if not config.compressed:
        return Layout(numel, numel, 0, 0, 0, 2 * numel)
    block = config.block
    padded = -(-numel // block) * block
    n_coarse = {"group": padded // config.group, "tensor": 1 if padded else 0, "none": 0}[config.coarse_scale]
    n_micro = padded // config.micro_group if config.micro_scale != "none" else 0
    code_bytes = padded * ELEMENT_BITS[config.element] // 8
    return Layout(numel, padded, n_coarse, n_micro, SCALE_BYTES[config.micro_scale], code_bytes)


def check_float_dtype(dtype: torch.dtype, what: str = "input") -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, got {dtype}")


@dataclass(frozen=True, eq=False)
class Packed:
    """A compressed tensor.

    codes          uint8: element codes; 4-bit codes two per byte (element 2i in the
                   low nibble), so ``codes.view(torch.float4_e2m1fn_x2)`` is valid for e2m1.
                   For the bf16 preset, the raw bfloat16 bytes.
    micro_scales   uint8 (e4m3 / e8m0 bytes) or float16, one per micro-group; may be empty
    coarse_scales  float32, one per group ("group"), one in all ("tensor"), or empty
    shape, dtype   of the original tensor; config: how it was compressed
    """

    codes: torch.Tensor
    micro_scales: torch.Tensor
    coarse_scales: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    config: QuantConfig

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def layout(self) -> Layout:
        return layout(self.numel, self.config)

    @property
    def nbytes(self) -> int:
        """Bytes that cross the wire (codes + scales; shape, dtype and config travel out of band)."""
        return self.layout.nbytes

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to_bytes(self) -> torch.Tensor:
        """One contiguous uint8 buffer: [coarse scales | micro-scales | codes]."""
        parts = [
            self.coarse_scales.contiguous().view(torch.uint8),
            self.micro_scales.contiguous().view(torch.uint8),
            self.codes.contiguous().view(torch.uint8),
        ]
        return torch.cat([p.reshape(-1) for p in parts])

    @classmethod
    def from_bytes(cls, buf: torch.Tensor, shape, dtype: torch.dtype, config: QuantConfig) -> Packed:
        """Inverse of to_bytes; the segments are views into ``buf``."""
        if buf.dtype != torch.uint8 or buf.dim() != 1:
            raise TypeError(f"buf must be a 1-D uint8 tensor, got {buf.dtype} with shape {tuple(buf.shape)}")
        check_float_dtype(dtype, "dtype")
        shape = torch.Size(shape)
        lay = layout(shape.numel(), config)
        if buf.numel() != lay.nbytes:
            raise ValueError(
                f"buf holds {buf.numel()} bytes but shape {tuple(shape)} under {config} needs {lay.nbytes}"
            )
        if not buf.is_contiguous():
            buf = buf.contiguous()
        a, b = lay.coarse_nbytes, lay.coarse_nbytes + lay.micro_nbytes
        micro = buf[a:b]
        if lay.micro_bytes == 2:
            micro = micro.clone() if buf.storage_offset() % 2 else micro
            micro = micro.view(torch.float16)
        coarse = buf[:a]
        if buf.storage_offset() % 4:
            coarse = coarse.clone()
        return cls(buf[b:], micro, coarse.view(torch.float32), shape, dtype, config)

    def __repr__(self) -> str:
        return (
            f"Packed(shape={tuple(self.shape)}, dtype={self.dtype}, config={self.config}, "
            f"nbytes={self.nbytes}, device={self.device})"
        )
