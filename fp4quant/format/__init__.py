"""The numbers: element and scale formats, QuantConfig and its presets, the wire format."""

from .config import PRESETS, QuantConfig
from .packed import Layout, Packed, layout

__all__ = ["PRESETS", "Layout", "Packed", "QuantConfig", "layout"]
