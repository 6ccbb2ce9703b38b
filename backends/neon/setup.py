"""Builds the Neon kernels as a plain C shared library (loaded with cffi, never imported).

The Extension is declared only on aarch64/arm64 hosts: elsewhere the package installs as pure Python and
its probe explains why the backend is unavailable.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # backends/lockstep.py: version and core pin
from lockstep import lockstep

HERE = Path(__file__).resolve().parent


def include_dir() -> str:
    """eemicrogpt.h: $EEMICROGPT_INCLUDE, the repository checkout, or an installed core."""
    if os.environ.get("EEMICROGPT_INCLUDE"):
        return os.environ["EEMICROGPT_INCLUDE"]
    in_repo = HERE.parent.parent / "eemicrogpt_core" / "include"
    if (in_repo / "eemicrogpt.h").is_file():
        return str(in_repo)
    from eemicrogpt_core import get_include

    return get_include()


def extensions() -> list[Extension]:
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return []
    # Apple clang targets Apple silicon (Neon + fp16) by default; Linux needs the architecture spelt out.
    arch = [] if sys.platform == "darwin" else ["-march=armv8.2-a+fp16"]
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.c"))
    return [
        Extension(
            "eemicrogpt_backend_neon._neon_kernels",
            sources=sources,
            include_dirs=[include_dir(), "csrc"],
            depends=[str(p) for p in (*(HERE / "csrc").glob("*.h"), *Path(include_dir()).glob("*.h"))],
            extra_compile_args=["-std=c11", "-O3", *arch],
            libraries=["m"],
        )
    ]


setup(ext_modules=extensions(), **lockstep())
