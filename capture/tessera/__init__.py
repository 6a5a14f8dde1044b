"""Tessera: GPU profiling that lands in TensorBoard.

`from tessera import profile` for capture; `tessera-prof` on the command line.
Importing `tessera` is cheap: subpackages load on first use, and nothing here imports torch.
"""

import importlib

from tessera_tb import __version__

__all__ = ["__version__", "profile"]


def __getattr__(name: str):
    # `import tessera; tessera.profile.session(...)` works without importing it up front.
    if name == "profile":
        return importlib.import_module("tessera.profile")
    raise AttributeError(f"module 'tessera' has no attribute {name!r}")
