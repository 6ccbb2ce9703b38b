"""The build command shared by the ARM backends' setup.py (neon, sme2_f32, sme2_f16).

Each backend's library is a plain C shared library (loaded with cffi, never imported), built by setuptools
on the machine that will run it, or cross-compiled by the aarch64 lane through this same path
(`_PYTHON_HOST_PLATFORM=linux-aarch64` with a cross CC/LDSHARED). What it adds to setuptools:
- the target is read from `sysconfig.get_platform()` (which honours `_PYTHON_HOST_PLATFORM`), so a cross
  build and a native one take the same decisions;
- a universal2 macOS Python (python.org's installer) would compile for arm64 and x86_64: the ARM kernels
  are built arm64-only and the wheel is tagged arm64;
- the library is linked with undefined symbols as errors (Linux `-z defs`; macOS `-undefined error`
  instead of Python's `dynamic_lookup`), so a missing SME runtime routine fails the build, not `dlopen`;
- an optional feature-test compile tells the user what compiler to install when theirs cannot build the
  kernels, and the reason is written next to where the library would be (`<stem>.not-built.txt`), where
  the backend's probe reports it;
- the objects and the linked library pass `a64_objcheck` (no SVE/SME outside streaming code). It needs
  llvm-objdump: absent, the check is skipped with a printed warning, unless EEMICROGPT_STRICT_BUILD=1 (the
  lane), which also turns every "not built" into a build failure.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from setuptools import Extension
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import a64_objcheck

STRICT_ENV = "EEMICROGPT_STRICT_BUILD"
NOT_BUILT_SUFFIX = ".not-built.txt"


class BuildRefused(Exception):
    """The build cannot give a correct library here; the message says what to do."""


BUILD_ERRORS = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, BuildRefused)


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def target_platform() -> str:
    """What the build targets: 'linux-aarch64', 'macosx-14.0-arm64', 'macosx-11.0-universal2', ..."""
    return sysconfig.get_platform()


def target_os() -> str:
    plat = target_platform()
    return "darwin" if plat.startswith("macosx") else plat.split("-", 1)[0]


def is_arm_target() -> bool:
    """Does this build produce code for aarch64 Linux or Apple silicon?"""
    plat = target_platform()
    if plat.startswith("linux-"):
        return plat.endswith(("-aarch64", "-arm64"))
    if plat.startswith("macosx-"):
        # A universal2 interpreter targets arm64 when it runs on Apple silicon.
        return plat.endswith("-arm64") or (plat.endswith("-universal2") and platform.machine() == "arm64")
    return False


def darwin_arm64_only_env() -> dict[str, str]:
    """Environment making setuptools compile and tag arm64-only on a universal2 Python ({} elsewhere)."""
    plat = target_platform()
    if not (plat.startswith("macosx-") and plat.endswith("-universal2")):
        return {}
    # ARCHFLAGS replaces every -arch in the compiler and linker flags (distutils' _osx_support);
    # the platform override gives the wheel its honest arm64 tag.
    return {"ARCHFLAGS": "-arch arm64", "_PYTHON_HOST_PLATFORM": plat.rsplit("-", 1)[0] + "-arm64"}


def strict_linker(linker: list[str], os_name: str) -> list[str]:
    """The linker command with undefined symbols made errors (Python's macOS default looks them up late)."""
    if os_name == "darwin":
        out: list[str] = []
        for arg in linker:
            if arg == "dynamic_lookup" and out and out[-1] == "-undefined":
                out.append("error")
            else:
                out.append(arg.replace("-undefined,dynamic_lookup", "-undefined,error"))
        if "error" not in out and not any("-undefined,error" in a for a in out):
            out += ["-Wl,-undefined,error"]
        return out
    return [*linker, "-Wl,-z,defs"]


def install_hint(os_name: str) -> str:
    """What to install when the compiler cannot build the SME2 kernels."""
    if os_name == "darwin":
        return (
            "use Apple clang from Xcode >= 16.3 (update Xcode, then xcode-select -s /Applications/Xcode.app), "
            "or Homebrew LLVM >= 19: brew install llvm && "
            "CC=\"$(brew --prefix llvm)/bin/clang\" pip install --force-reinstall --no-deps <backend dir>"
        )
    return (
        "use clang >= 19 (gcc and clang <= 18 cannot build them): e.g. apt install clang-19 && "
        "CC=clang-19 pip install --force-reinstall --no-deps <backend dir>"
    )


@dataclass
class ObjCheck:
    """How a64_objcheck judges an extension's code."""

    no_sme: bool = False  # the whole library must run on CPUs without SME (Neon)
    streaming_from: list[Path] = field(default_factory=list)  # sources naming __arm_streaming functions
    plain_no_sme: bool = True  # separately compiled plain objects must hold no SVE/SME at all


class ArmExtension(Extension):
    """An Extension with ARM build facts: plain objects with their own flags, a feature test, a check."""

    def __init__(
        self,
        name: str,
        *,
        plain: dict[str, list[str]] | None = None,
        feature_test: str | None = None,
        objcheck: ObjCheck | None = None,
        backend: str = "",
        sme_runtime: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(name, **kwargs)
        self.plain = plain or {}
        self.feature_test = feature_test
        self.objcheck = objcheck or ObjCheck()
        self.backend = backend or name
        self.sme_runtime = sme_runtime
        self.optional = True  # an editable install survives a compiler that cannot build it


class ArmBuildExt(build_ext):
    def run(self) -> None:
        os.environ.update(darwin_arm64_only_env())
        super().run()

    def build_extension(self, ext: Extension) -> None:
        stem = ext.name.rsplit(".", 1)[-1]
        reason_file = Path(self.get_ext_fullpath(ext.name)).parent / (stem + NOT_BUILT_SUFFIX)
        reason_file.unlink(missing_ok=True)
        try:
            self._build(ext)
        except BUILD_ERRORS as exc:
            message = f"{getattr(ext, 'backend', ext.name)}: the kernels library was not built: {exc}"
            if strict():
                raise BuildRefused(message) from exc
            print(f"warning: {message}", file=sys.stderr)
            reason_file.parent.mkdir(parents=True, exist_ok=True)
            reason_file.write_text(message + "\n")

    def _build(self, ext: Extension) -> None:
        os_name = target_os()
        if not isinstance(ext, ArmExtension):
            super().build_extension(ext)
            return
        if ext.feature_test:
            self._feature_test(ext, os_name)
        temp = os.path.join(self.build_temp, ext.name)
        objects: list[str] = []
        for source, flags in ext.plain.items():
            objects += self.compiler.compile(
                [source], output_dir=temp, macros=ext.define_macros, include_dirs=ext.include_dirs,
                extra_postargs=flags,
            )
        ext.extra_objects = [*ext.extra_objects, *objects]
        self.compiler.linker_so = strict_linker(list(self.compiler.linker_so), os_name)
        if ext.sme_runtime and os_name == "linux" and compiler_is_clang(self.compiler.linker_so):
            # The SME ABI routines (__arm_tpidr2_save, __arm_sme_state, ...) are in compiler-rt's builtins
            # (libgcc has them from GCC 14 only); macOS's libSystem provides them.
            ext.extra_link_args = [*ext.extra_link_args, "--rtlib=compiler-rt"]
        super().build_extension(ext)
        self._objcheck(ext, objects, self.get_ext_fullpath(ext.name))

    def _feature_test(self, ext: ArmExtension, os_name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "emg_feature_test.c"
            source.write_text(ext.feature_test or "")
            try:
                self.compiler.compile(
                    [str(source)], output_dir=tmp, macros=ext.define_macros,
                    extra_postargs=ext.extra_compile_args,
                )
            except CompileError as exc:
                raise BuildRefused(
                    f"{' '.join(self.compiler.compiler_so[:1])} cannot compile the SME2 constructs the kernels "
                    f"use (__arm_locally_streaming, __arm_new(\"za\"), SVE intrinsics in a +sme2 unit without "
                    f"+sve, SME2 multi-vector reads) or enables SVE in that unit; {install_hint(os_name)}"
                ) from exc

    def _objcheck(self, ext: ArmExtension, plain_objects: list[str], library: str) -> None:
        """Check our objects per function (the library also holds the toolchain's SME runtime routines,
        which guard their SVE instructions at run time and are not ours to judge)."""
        objdump = os.environ.get("LLVM_OBJDUMP") or a64_objcheck.find_objdump()
        if objdump is None:
            message = (f"{ext.backend}: llvm-objdump (LLVM >= 17) not found: the check that no SVE/SME "
                       "instruction runs outside streaming mode was skipped")
            if strict():
                raise BuildRefused(message)
            print(f"warning: {message}", file=sys.stderr)
            return
        check = ext.objcheck
        streaming = a64_objcheck.streaming_functions(*check.streaming_from)
        ext_objects = self.compiler.object_filenames(ext.sources, output_dir=self.build_temp)
        missing = [o for o in ext_objects if not Path(o).is_file()]
        if missing:
            raise BuildRefused(f"object check: compiled objects not found where expected: {missing}")
        problems = [p for o in plain_objects
                    for p in a64_objcheck.check_file(Path(o), objdump, set(), no_sme=check.plain_no_sme)]
        problems += [p for o in ext_objects
                     for p in a64_objcheck.check_file(Path(o), objdump, streaming, no_sme=check.no_sme)]
        if problems:
            Path(library).unlink(missing_ok=True)  # never leave a library that would SIGILL
            raise BuildRefused("instructions the target CPU cannot run here:\n  " + "\n  ".join(problems))
        print(f"{ext.backend}: object check passed ({len(plain_objects) + len(ext_objects)} objects, "
              f"streaming functions: {', '.join(sorted(streaming)) or 'none'})")


def compiler_is_clang(compiler: list[str]) -> bool:
    if any("clang" in Path(part).name for part in compiler[:1]):
        return True
    try:
        out = subprocess.run([*compiler[:1], "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(re.search(r"\bclang\b", out))
