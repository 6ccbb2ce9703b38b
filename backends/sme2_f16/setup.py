"""Builds the plain C libraries of sme2_f16 (fp16 FMOPA into za16) and sme2_f16w (widening fp16 FMOPA into
za32) on aarch64 Linux/macOS only.

Elsewhere the package installs as pure Python and its probe says why the backends are unavailable. The
aarch64 lane cross-builds through this same file. What it shares with the other SME2 and ARM backends (build
helpers, kernel sources, the ABI headers, the core's version, the probe and spec modules) is copied into
`_build/` here and the package from the repository by ../share.py when that exists; an sdist ships the copies.
"""

import runpy
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SHARE = HERE.parent / "share.py"
if SHARE.is_file():  # a repository checkout: refresh the copies
    runpy.run_path(str(SHARE))["share"](HERE, "eemicrogpt_backend_sme2_f16")
sys.path.insert(0, str(HERE / "_build"))  # the copies: lockstep, sme2_setup and what it imports
from lockstep import lockstep  # noqa: E402
from sme2_setup import sme2_setup_kwargs  # noqa: E402

setup(**sme2_setup_kwargs(
    sme2_f16="eemicrogpt_backend_sme2_f16._emg_sme2_f16", sme2_f16w="eemicrogpt_backend_sme2_f16._emg_sme2_f16w"
), **lockstep("numpy>=1.24", "cffi>=1.15"))
