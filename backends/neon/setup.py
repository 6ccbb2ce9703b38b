"""Builds the Neon kernels as a plain C shared library (loaded with cffi, never imported).

The Extension is declared only when building for aarch64 Linux or Apple silicon (natively, or cross-built
by the aarch64 lane through this same file): elsewhere the package installs as pure Python and its probe
explains why the backend is unavailable. The build command (strict linking, arm64-only on universal2
Pythons, the check that no SVE/SME instruction slipped in) is ../arm_common/arm_setup.py. What it shares with
the repository (that build command, lockstep.py, the core's version, the ABI headers, the Neon helpers it
shares with the SME2 backends: ../arm_common/csrc) is copied into `_build/` here by ../share.py in a
repository checkout; an sdist ships the copies.

The step is compiled once per width, each its own translation unit, from csrc/step_impl.h: the two-line
unit of each width in NEON_WIDTHS is written into `_build/steps/` here (csrc/session.h declares the table
entries, csrc/abi.c lists them). Wider widths, 272-1024, share one unit with the width a run-time value
(csrc/step_wide.c).
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

# d_model of the width-specialised steps (csrc/abi.c's KERNELS lists the same entries).
NEON_WIDTHS = range(16, 257, 16)
STEPS = HERE / "_build" / "steps"

# Armv8.0-A: Advanced SIMD is baseline and the kernels use no FP16 instruction, so Cortex-A72 (Raspberry
# Pi 4, Graviton 1) runs them. Apple clang's default target is already Apple silicon.
LINUX_ARCH = "-march=armv8-a"


def include_dir() -> str:
    """The ABI headers: $EEMICROGPT_INCLUDE, else the copy in _build/."""
    return os.environ.get("EEMICROGPT_INCLUDE") or str(HERE / "_build" / "include")


def compile_args(os_name: str) -> list[str]:
    return ["-std=c11", "-O3", *([] if os_name == "darwin" else [LINUX_ARCH])]


def step_sources() -> list[str]:
    """One translation unit per width: step_impl.h with that width's D_MODEL and table entry (rewritten only
    when its text changes, so incremental builds stay incremental)."""
    os.makedirs(STEPS, exist_ok=True)
    paths = []
    for d in NEON_WIDTHS:
        path = STEPS / f"step_d{d}.c"
        text = f"#define D_MODEL {d}\n#define KERNEL_NAME emg_neon_kernel_d{d}\n#include \"step_impl.h\"\n"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        paths.append(str(path.relative_to(HERE)))
    return paths


def extensions() -> list[ArmExtension]:
    if not is_arm_target():
        return []
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.c")) + step_sources()
    return [
        ArmExtension(
            "eemicrogpt_backend_neon._neon_kernels",
            backend="neon",
            sources=sources,
            include_dirs=[include_dir(), "csrc", str(HERE / "_build" / "arm_common")],
            depends=[str(p) for p in (*(HERE / "csrc").glob("*.h"), *Path(include_dir()).glob("*.h"),
                                      *(HERE / "_build" / "arm_common").glob("*.h"))],
            extra_compile_args=compile_args(target_os()),
            libraries=["m"],
            objcheck=ObjCheck(no_sme=True),
        )
    ]


if __name__ == "__main__":
    setup(ext_modules=extensions(), cmdclass={"build_ext": ArmBuildExt}, **lockstep())
