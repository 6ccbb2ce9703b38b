"""numpy_ref is pure Python; setup.py only supplies its version and core pin (lockstep with the core)."""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # backends/lockstep.py: version and core pin
from lockstep import lockstep

setup(**lockstep("numpy>=1.24"))
