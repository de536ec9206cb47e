"""What crosses the wire: decided once per direction of traffic, never asked again below.

exact       the tensor itself, in its own dtype (torch's collective, torch's result)
cast        the tensor cast to a narrower dtype (bf16: what a BF16 training run sends) for
            the collective and back; a tensor already that narrow is sent as it is
compressed  the codec's messages under a compressed QuantConfig

``Wire.of(spec)`` is the one place a config becomes a wire.  ``uncompressed`` says what an
uncompressed QuantConfig (the ``bf16`` preset) means: ``"exact"`` for the collectives of
fp4quant.comm (the bf16 preset there is torch's own collective), ``"cast"`` for tensor
parallelism (BF16 on the wire, as a BF16 run sends it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format.config import QuantConfig, as_config

KINDS = ("exact", "cast", "compressed")


@dataclass(frozen=True)
class Wire:
    kind: str
    config: QuantConfig | None = None  # compressed: the codec's config
    dtype: torch.dtype | None = None  # cast: the dtype on the wire

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"wire kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "compressed") != (self.config is not None and self.config.compressed):
            raise ValueError("a compressed wire needs a compressed QuantConfig, and only it has one")
        if (self.kind == "cast") != (self.dtype is not None):
            raise ValueError("a cast wire needs a dtype, and only it has one")

    @classmethod
    def exact(cls) -> Wire:
        return cls("exact")

    @classmethod
    def cast(cls, dtype: torch.dtype = torch.bfloat16) -> Wire:
        return cls("cast", dtype=dtype)

    @classmethod
    def of(cls, spec: Wire | QuantConfig | str | None, uncompressed: str = "exact") -> Wire:
        """A wire from a Wire, a QuantConfig, a preset name, "exact" or None (exact)."""
        if isinstance(spec, Wire):
            return spec
        if spec is None or spec == "exact":
            return cls.exact()
        config = as_config(spec)
        if config.compressed:
            return cls("compressed", config=config)
        if uncompressed not in ("exact", "cast"):
            raise ValueError(f"uncompressed must be 'exact' or 'cast', got {uncompressed!r}")
        return cls.cast(torch.bfloat16) if uncompressed == "cast" else cls.exact()

    @property
    def block(self) -> int:
        """The codec's padding block (compressed wires only)."""
        assert self.config is not None
        return self.config.block

    def narrows(self, dtype: torch.dtype) -> bool:
        """A cast wire whose dtype is narrower than ``dtype``: the tensor is cast for the wire."""
        return self.kind == "cast" and torch.finfo(dtype).bits > torch.finfo(self.dtype).bits

    def __str__(self) -> str:
        if self.kind == "compressed":
            return str(self.config)
        return "exact" if self.kind == "exact" else f"cast:{str(self.dtype).removeprefix('torch.')}"
