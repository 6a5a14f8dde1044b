"""Tessera trace processing and the Tessera Profiler TensorBoard plugin."""

__version__ = "0.1.0"
