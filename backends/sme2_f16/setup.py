"""Builds the plain C libraries of sme2_f16 (fp16 FMOPA into za16) and sme2_f16w (widening fp16 FMOPA into
za32) from ../sme2_common on aarch64 Linux/macOS only.

Elsewhere (and when staged without the sibling sources) the package installs as pure Python and its
probe says why the backend is unavailable. The aarch64 lane cross-builds through this same file.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # backends/lockstep.py: version and core pin
from lockstep import lockstep

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sme2_common"))
METADATA = lockstep("numpy>=1.24", "cffi>=1.15", siblings=("eemicrogpt-backend-sme2",))
try:
    from sme2_setup import sme2_setup_kwargs
except ImportError:
    setup(**METADATA)
else:
    setup(**sme2_setup_kwargs(
        sme2_f16="eemicrogpt_backend_sme2_f16._emg_sme2_f16", sme2_f16w="eemicrogpt_backend_sme2_f16._emg_sme2_f16w"
    ), **METADATA)
