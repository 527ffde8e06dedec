"""Moved to macapp.core.upstream (below the engine, so vision and the demo model import it too); these names are
handed on for batch.py and solo.py until they import it from there."""

from macapp.core.upstream import quantized_layers, sampled_not_read

__all__ = ["quantized_layers", "sampled_not_read"]
