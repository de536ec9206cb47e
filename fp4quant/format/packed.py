"""The wire format: Packed, and its one-buffer byte layout (docs/format.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import QuantConfig, as_config
from .elements import ELEMENT_BITS, SCALE_BYTES

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INT64_MAX = (1 << 63) - 1


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


def _check_cut(config: QuantConfig, values: int, what: str) -> None:
    if not config.compressed or config.coarse_scale == "tensor":
        why = "a per-tensor scale is not block-local" if config.compressed else "they are not compressed"
        raise ValueError(f"messages under {config} cannot be cut into blocks: {why}")
    if values % config.block:
        raise ValueError(f"{what} {values} is not a multiple of the block ({config.block} values)")


def _segment_spans(lay: Layout, config: QuantConfig, start: int, stop: int) -> list[tuple[int, int]]:
    """Byte ranges of values [start, stop) (block-aligned) in each segment of a message."""
    per_group = 4 if lay.n_coarse else 0  # coarse bytes per group
    per_micro = lay.micro_bytes if lay.n_micro else 0
    bits = ELEMENT_BITS[config.element]
    coarse = [v // config.group * per_group for v in (start, stop)]
    micro = [lay.coarse_nbytes + v // config.micro_group * per_micro for v in (start, stop)]
    codes = [lay.coarse_nbytes + lay.micro_nbytes + v * bits // 8 for v in (start, stop)]
    return [(coarse[0], coarse[1]), (micro[0], micro[1]), (codes[0], codes[1])]


def slice_messages(msgs: torch.Tensor, n: int, config: QuantConfig, start: int, stop: int) -> torch.Tensor:
    """Values [start, stop) of each row of ``msgs`` (uint8 (rows, nbytes(n))) as messages of
    their own: (rows, nbytes(stop - start)).  Block-local configs only (not a per-tensor
    scale), ``start`` and ``stop`` block boundaries: every block is encoded on its own, so
    these are the bytes that quantizing those values alone would give."""
    lay = layout(n, config)
    _check_cut(config, start, "start")
    _check_cut(config, stop, "stop")
    if not 0 <= start <= stop <= lay.padded:
        raise ValueError(f"values [{start}, {stop}) are not within the {lay.padded} (padded) values of the messages")
    return torch.cat([msgs[:, a:b] for a, b in _segment_spans(lay, config, start, stop)], dim=1)


def join_messages(parts: list[torch.Tensor], sizes: list[int], config: QuantConfig) -> torch.Tensor:
    """One message (uint8 (nbytes(sum(sizes)),)) of consecutive pieces of values: ``parts[k]``
    the message of ``sizes[k]`` values, each size but the last a multiple of the block; the
    inverse of slice_messages (block-local configs only)."""
    if len(parts) != len(sizes) or not parts:
        raise ValueError(f"join_messages needs one size per part, got {len(parts)} parts and {len(sizes)} sizes")
    if len(parts) == 1:
        return parts[0]
    for size in sizes[:-1]:
        _check_cut(config, size, "a piece of")
    pieces = []
    spans = [_segment_spans(layout(size, config), config, 0, layout(size, config).padded) for size in sizes]
    for segment in range(3):  # all coarse scales, then all micro-scales, then all codes
        for part, span in zip(parts, spans):
            a, b = span[segment]
            pieces.append(part[a:b])
    return torch.cat(pieces)


def check_float_dtype(dtype: torch.dtype, what: str = "input") -> None:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, got {dtype}")


def check_shape(shape) -> torch.Size:
    """``shape`` as a torch.Size; ValueError unless every size is an int >= 0 and a tensor of
    that shape could exist: the product of its sizes (zero sizes counted as one, as torch does
    when it sizes storage) fits in int64.  torch.Size holds larger ints, and its numel()
    wraps around past int64 (to 0 for (2**40, 2**40)), so a layout would be computed for
    the wrong count."""
    try:
        size = torch.Size(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in size):
        raise ValueError(f"shape must hold sizes >= 0, got {tuple(size)}")
    if math.prod(max(d, 1) for d in size) > INT64_MAX:
        raise ValueError(f"shape {tuple(size)} is too large: its element count must fit in int64 (at most 2**63 - 1)")
    return size


def _check_segment(t, name: str, dtype: torch.dtype, entries: int, packed: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != 1 or t.numel() != entries:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{packed}: {name} must be a 1-D {dtype} tensor of {entries} entries, got {got}")


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

    def __post_init__(self) -> None:
        # Everything dequantize relies on, checked here, so a bad Packed fails where it is made.
        if not isinstance(self.config, QuantConfig):
            raise TypeError(f"Packed.config must be a QuantConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "shape", check_shape(self.shape))
        check_float_dtype(self.dtype, "Packed.dtype")
        lay = self.layout
        what = f"Packed of shape {tuple(self.shape)} under {self.config}"
        micro_dtype = torch.float16 if self.config.micro_scale == "fp16" and self.config.compressed else torch.uint8
        _check_segment(self.codes, "codes", torch.uint8, lay.code_bytes, what)
        _check_segment(self.micro_scales, "micro_scales", micro_dtype, lay.n_micro, what)
        _check_segment(self.coarse_scales, "coarse_scales", torch.float32, lay.n_coarse, what)
        devices = {self.codes.device, self.micro_scales.device, self.coarse_scales.device}
        if len(devices) > 1:
            raise ValueError(f"{what}: codes and scales are on different devices {sorted(map(str, devices))}")

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
    def from_bytes(cls, buf: torch.Tensor, shape, dtype: torch.dtype, config: QuantConfig | str) -> Packed:
        """Inverse of to_bytes; the segments are views into ``buf``.  ``config``: a QuantConfig
        or a preset name."""
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
            got = f"{buf.dtype} with shape {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise TypeError(f"buf must be a 1-D uint8 tensor, got {got}")
        check_float_dtype(dtype, "dtype")
        config = as_config(config)
        shape = check_shape(shape)
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
