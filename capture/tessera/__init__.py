"""Tessera: GPU profiling that lands in TensorBoard.

`from tessera import profile` for capture; `tessera-prof` on the command line.
"""

from tessera_tb import __version__

__all__ = ["__version__"]
