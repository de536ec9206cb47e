"""Pure-PyTorch reference codec and FWHT: readable, vectorized, the oracle for every kernel."""

from .codec import dequantize, quantize
from .fwht import fwht, ifwht

__all__ = ["dequantize", "fwht", "ifwht", "quantize"]
