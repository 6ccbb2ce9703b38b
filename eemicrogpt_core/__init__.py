"""eemicrogpt: train tiny character-level GPTs on a CPU, fast. The core package."""

from .native import get_include

__version__ = "0.1.0"
__all__ = ["__version__", "get_include"]
