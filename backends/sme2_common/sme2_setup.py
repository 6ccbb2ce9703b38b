"""setup() keyword arguments for an SME2 backend built natively on aarch64 Linux or macOS.

Imported by backends/sme2_f32/setup.py and backends/sme2_f16/setup.py (only on such hosts) so that both
packages build the same sources with the same flags. Only sme2_gemm.c may see the SME extensions: the
step is plain C (no SVE may leak into non-streaming code: Apple M4 has none) and the CPU probe must run
on any aarch64 CPU, so those two are compiled separately and linked in as objects.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError

HERE = Path(__file__).resolve().parent
INCLUDE = os.environ.get("EEMICROGPT_INCLUDE", str(HERE.parent.parent / "eemicrogpt_core" / "include"))
WARN = ["-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra"]
PLAIN = {"sme2_step.c": ["-O3", "-march=armv8.7-a"], "sme2_cpu.c": ["-O2", "-march=armv8-a"]}


def _is_clang(compiler: list[str]) -> bool:
    return any("clang" in part for part in compiler)


class BuildSme2(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            self._build(ext)
        except (CCompilerError, CompileError, ExecError, LinkError) as exc:
            # A compiler without SME2 support (e.g. GCC < 14) must not break the install: the package
            # installs without its library and the probe says that it was not built.
            print(f"warning: {ext.name} not built ({exc}); use clang >= 17 (CC=clang) to build it")

    def _build(self, ext: Extension) -> None:
        objects: list[str] = []
        for source, flags in PLAIN.items():
            objects += self.compiler.compile(
                [str(HERE / source)],
                output_dir=os.path.join(self.build_temp, ext.name),
                macros=ext.define_macros,
                include_dirs=ext.include_dirs,
                extra_postargs=WARN + flags,
            )
        ext.extra_objects = [*ext.extra_objects, *objects]
        if sys.platform.startswith("linux"):
            # The SME ABI routines (__arm_tpidr2_save, __arm_sme_state, ...) come from compiler-rt with
            # clang (libgcc has them from GCC 14); -z defs turns any missing one into a build error.
            runtime = ["--rtlib=compiler-rt"] if _is_clang(self.compiler.compiler_so) else []
            ext.extra_link_args = [*ext.extra_link_args, *runtime, "-Wl,-z,defs"]
        super().build_extension(ext)


def native_host() -> bool:
    """aarch64 Linux or macOS: where the library can be built and run."""
    return sys.platform in ("linux", "darwin") and platform.machine().lower() in ("aarch64", "arm64")


def sme2_setup_kwargs(extension: str, f16: bool) -> dict[str, Any]:
    """The Extension and build command on a native host; nothing elsewhere (a pure-Python install)."""
    if not native_host():
        return {}
    arch = "-march=armv8.7-a+sme2" + ("+sme-f16f16" if f16 else "")  # not armv9-a: see build_aarch64.sh
    ext = Extension(
        extension,
        sources=[str(HERE / "sme2_gemm.c")],
        include_dirs=[INCLUDE, str(HERE)],
        define_macros=[("EMG_SME_F16", "1" if f16 else "0")],
        depends=[str(HERE / "sme2_internal.h"), *(str(HERE / name) for name in PLAIN),
                 *(str(p) for p in Path(INCLUDE).glob("*.h"))],
        extra_compile_args=[*WARN, "-O3", arch],
        libraries=["m"],
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildSme2}}
