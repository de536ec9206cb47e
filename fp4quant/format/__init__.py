"""The numbers: element and scale formats, QuantConfig and its presets, the wire format."""

from .config import PRESETS, QuantConfig, as_config
from .packed import Layout, Packed, layout

__all__ = ["PRESETS", "Layout", "Packed", "QuantConfig", "as_config", "layout"]
