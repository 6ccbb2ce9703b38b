"""Builds the x86 backend's plain C shared libraries (loaded with cffi, never imported).

Five libraries, x86_64 only: the same kernel sources per variant (AVX-512, AVX2+FMA, AVX-512 with bf16 GEMMs
on VDPBF16PS or on AMX tiles) and a feature probe compiled without target flags. Elsewhere nothing is built
and the probe explains why. What it shares with the repository (lockstep.py, the core's version, the ABI
headers) is copied into `_build/` here by ../share.py in a repository checkout; an sdist ships the copies.
"""

from __future__ import annotations

import copy
import os
import platform
import runpy
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SHARE = HERE.parent / "share.py"
if SHARE.is_file():  # a repository checkout: refresh the copies
    runpy.run_path(str(SHARE))["share"](HERE)
sys.path.insert(0, str(HERE / "_build"))  # the copies: lockstep.py (version and core pin)
from lockstep import lockstep  # noqa: E402

INCLUDE = os.environ.get("EEMICROGPT_INCLUDE", str(HERE / "_build" / "include"))  # the ABI headers
KERNEL_SOURCES = ["csrc/step.c", "csrc/step_wide.c", "csrc/session.c", "csrc/threads.c", "csrc/pool.c", "csrc/peak.c"]
# -fno-wrapv undoes the -fwrapv that Python's CFLAGS add: with wrapping signed ints gcc cannot simplify the
# kernels' index arithmetic (measured 5-10% slower steps at d32/d64).
COMMON = ["-O3", "-std=gnu11", "-fno-wrapv", "-fno-math-errno", "-fvisibility=hidden", "-Wall", "-Wextra"]
VARIANTS = {
    "avx512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
    # The same kernels with bf16 GEMMs (csrc/gemm_bf16.h: VDPBF16PS, fp32 accumulation and master weights).
    "avx512_bf16": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma", "-mavx512bf16", "-DEMG_BF16"],
    # bf16 GEMMs on AMX tiles (csrc/gemm_amx.h: TDPBF16PS), every width through the run-time-width step.
    "amx_bf16": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma", "-mavx512bf16", "-mamx-tile",
                 "-mamx-bf16", "-DEMG_BF16", "-DEMG_AMX"],
}
OPTIONAL = {"avx512_bf16", "amx_bf16"}  # compilers without the flags (gcc < 10, < 11 for AMX) skip only these


class BuildVariants(build_ext):
    """Build the libraries side by side (the AVX-512 and AVX2 kernels are minutes of compiler time each),
    each Extension with its own object directory: the variants compile the same .c files."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext: Extension) -> None:
        own = copy.copy(self)  # a per-Extension build_temp without touching the one other threads read
        own.build_temp = os.path.join(self.build_temp, ext.name.rsplit(".", 1)[-1])
        build_ext.build_extension(own, ext)


def extensions() -> list[Extension]:
    if platform.machine().lower() not in ("x86_64", "amd64") or os.name != "posix":
        return []
    exts = [
        Extension(
            f"eemicrogpt_backend_x86._emg_{name}",
            sources=KERNEL_SOURCES,
            include_dirs=[INCLUDE, "csrc"],
            depends=[str(p) for p in (*(HERE / "csrc").glob("*.h"), *Path(INCLUDE).glob("*.h"))],
            extra_compile_args=COMMON + flags,
            libraries=["m", "pthread"],
            optional=name in OPTIONAL,
        )
        for name, flags in VARIANTS.items()
    ]
    exts.append(
        Extension(
            "eemicrogpt_backend_x86._emg_probe",
            sources=["csrc/probe.c"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall"],  # no -m flags: must never fault
        )
    )
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildVariants}, **lockstep("numpy>=1.24", "cffi>=1.15"))
