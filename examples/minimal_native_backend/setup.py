"""Builds csrc/example_c.c as a plain C shared library (loaded with cffi by eemicrogpt, never imported).

The header comes from $EEMICROGPT_INCLUDE, else from the installed core (eemicrogpt_core.get_include(), so
build with `pip install --no-build-isolation` next to an installed eemicrogpt), else from this repository.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent


def include_dir() -> str:
    if os.environ.get("EEMICROGPT_INCLUDE"):
        return os.environ["EEMICROGPT_INCLUDE"]
    try:
        from eemicrogpt_core import get_include
    except ImportError:
        return str(HERE.parent.parent / "eemicrogpt_core" / "include")
    return get_include()


setup(
    ext_modules=[
        Extension(
            "eemicrogpt_backend_example_c._example_c",
            sources=["csrc/example_c.c"],
            include_dirs=[include_dir()],
            depends=[str(p) for p in Path(include_dir()).glob("*.h")],  # rebuild when the shared layer changes
            extra_compile_args=["-std=c11", "-O2"],
            libraries=["m"],
        )
    ]
)
