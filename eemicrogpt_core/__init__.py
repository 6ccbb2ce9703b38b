"""eemicrogpt: train tiny character-level GPTs on a CPU, fast. The core package."""

from ._version import __version__
from .base.abi import get_include

__all__ = ["__version__", "get_include"]
