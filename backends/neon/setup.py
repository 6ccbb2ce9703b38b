"""Builds the Neon kernels as a plain C shared library (loaded with cffi, never imported).

The Extension is declared only when building for aarch64 Linux or Apple silicon (natively, or cross-built
by the aarch64 lane through this same file): elsewhere the package installs as pure Python and its probe
explains why the backend is unavailable. The build command (strict linking, arm64-only on universal2
Pythons, the check that no SVE/SME instruction slipped in) is ../arm_common/arm_setup.py. What it shares with
the repository (that build command, lockstep.py, the core's version, the ABI headers) is copied into `_build/`
here by ../share.py in a repository checkout; an sdist ships the copies.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SHARE = HERE.parent / "share.py"
if SHARE.is_file():  # a repository checkout: refresh the copies
    runpy.run_path(str(SHARE))["share"](HERE)
sys.path.insert(0, str(HERE / "_build"))  # the copies: lockstep.py, arm_setup.py and what it imports
from arm_setup import ArmBuildExt, ArmExtension, ObjCheck, is_arm_target, target_os  # noqa: E402
from lockstep import lockstep  # noqa: E402

# Armv8.0-A: Advanced SIMD is baseline and the kernels use no FP16 instruction, so Cortex-A72 (Raspberry
# Pi 4, Graviton 1) runs them. Apple clang's default target is already Apple silicon.
LINUX_ARCH = "-march=armv8-a"


def include_dir() -> str:
    """The ABI headers: $EEMICROGPT_INCLUDE, else the copy in _build/."""
    return os.environ.get("EEMICROGPT_INCLUDE") or str(HERE / "_build" / "include")


def compile_args(os_name: str) -> list[str]:
    return ["-std=c11", "-O3", *([] if os_name == "darwin" else [LINUX_ARCH])]


def extensions() -> list[ArmExtension]:
    if not is_arm_target():
        return []
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.c"))
    return [
        ArmExtension(
            "eemicrogpt_backend_neon._neon_kernels",
            backend="neon",
            sources=sources,
            include_dirs=[include_dir(), "csrc"],
            depends=[str(p) for p in (*(HERE / "csrc").glob("*.h"), *Path(include_dir()).glob("*.h"))],
            extra_compile_args=compile_args(target_os()),
            libraries=["m"],
            objcheck=ObjCheck(no_sme=True),
        )
    ]


if __name__ == "__main__":
    setup(ext_modules=extensions(), cmdclass={"build_ext": ArmBuildExt}, **lockstep())
