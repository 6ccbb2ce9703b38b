"""numpy_ref is pure Python; setup.py only supplies its version and core pin (lockstep with the core).

lockstep.py and the core's version are copied into `_build/` here by ../share.py in a repository checkout; an
sdist ships the copies.
"""

import runpy
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SHARE = HERE.parent / "share.py"
if SHARE.is_file():  # a repository checkout: refresh the copies
    runpy.run_path(str(SHARE))["share"](HERE)
sys.path.insert(0, str(HERE / "_build"))  # the copies: lockstep.py (version and core pin)
from lockstep import lockstep  # noqa: E402

setup(**lockstep("numpy>=1.24"))
