"""vramgate: a local GPU inference server that admits work by measured VRAM bytes."""

__version__ = "0.1.0"
