"""sme2_f32's plain C shared library (loaded with cffi, never imported), from ../sme2_common.

Declared only on aarch64 Linux/macOS; elsewhere the package installs as pure Python and its probe says
why the backend is unavailable. The aarch64 lane cross-builds the same sources with build_aarch64.sh.
"""

import platform
import sys
from pathlib import Path

from setuptools import setup

COMMON = Path(__file__).resolve().parent.parent / "sme2_common"

if sys.platform in ("linux", "darwin") and platform.machine().lower() in ("aarch64", "arm64"):
    sys.path.insert(0, str(COMMON))
    from sme2_setup import sme2_setup_kwargs

    setup(**sme2_setup_kwargs("eemicrogpt_backend_sme2._emg_sme2", f16=False))
else:
    setup()
