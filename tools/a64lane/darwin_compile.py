"""Stage 5b: compile every ARM backend source for macOS (arm64-apple-macos14) as its setup.py would on a
Mac, with clang 19 (what Apple clang 17 is based on) and a current clang (zig's clang 22), at the setup's
optimisation level and at -O0 (nothing may depend on the optimiser inlining a call inside a ZA-using
function: clang 19 crashes on such a call for Darwin). Then check that every symbol the objects of a library
leave undefined is one Apple's runtime provides: libSystem's exports (zig's libSystem.tbd) plus the SME ABI
routines of Apple's compiler runtime; and every object passes the same per-function SVE/SME check as the
Linux build (a64_objcheck). Nothing Apple can run here; this proves the build, not the code.

Run with the lane's build venv Python (ziglang installed): python darwin_compile.py <repo>
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TARGET = "--target=arm64-apple-macos14"
# Apple's toolchain runtime (libclang_rt.osx.a, linked by Apple clang) provides the SME ABI routines;
# libSystem does not export them, so they are not in its .tbd.
SME_ABI = {"___arm_tpidr2_save", "___arm_tpidr2_restore", "___arm_za_disable", "___arm_sme_state",
           "___arm_get_current_vg"}
NM = "llvm-nm-19"


@dataclass(frozen=True)
class Unit:
    source: Path
    flags: list[str]
    no_sme: bool = True  # a64_objcheck: no SVE/SME at all (everything but the SME kernels)


@dataclass(frozen=True)
class Library:
    name: str
    units: list[Unit]
    feature_test: Unit | None  # the setup's probe of the compiler: must pass wherever the kernels compile


def zig_dir() -> Path:
    import ziglang

    return Path(ziglang.__file__).resolve().parent


def compilers() -> dict[str, list[str]]:
    """Raw clang drivers with macOS libc headers (zig's). `zig cc` would rewrite -march into its own CPU
    spelling and refuse `-march=armv8.7-a`; `zig clang` takes the Apple flags unchanged."""
    darwin_headers = str(zig_dir() / "lib" / "libc" / "include" / "any-darwin-any")
    resource19 = subprocess.run(["clang-19", "-print-resource-dir"], check=True, capture_output=True,
                                text=True).stdout.strip()
    return {
        "clang 19": ["clang-19", TARGET, "-nostdinc", "-isystem", f"{resource19}/include", "-isystem", darwin_headers],
        "zig clang 22": [sys.executable, "-m", "ziglang", "clang", TARGET, "-nostdinc",
                         "-isystem", str(zig_dir() / "lib" / "include"), "-isystem", darwin_headers],
    }


def libsystem_exports() -> set[str]:
    text = (zig_dir() / "lib" / "libc" / "darwin" / "libSystem.tbd").read_text()
    return set(re.findall(r"(?<![\w$])(_[A-Za-z_$][\w$.]*)", text))


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def libraries(repo: Path, tmp: Path) -> list[Library]:
    """The libraries and per-source flags the setup.py files declare for a macOS arm64 target."""
    os.environ["_PYTHON_HOST_PLATFORM"] = "macosx-14.0-arm64"  # what sysconfig reports on a Mac
    backends = repo / "backends"
    sys.path[:0] = [str(backends / "arm_common"), str(backends / "sme2_common")]
    sme2_setup = load_module("sme2_setup", backends / "sme2_common" / "sme2_setup.py")
    neon_setup = load_module("neon_setup", backends / "neon" / "setup.py")
    exts = [*neon_setup.extensions()]
    exts += [sme2_setup.sme2_extension(f"_emg_{name}", name) for name in sme2_setup.VARIANTS]
    # A64_LANE_ONLY (lib.sh): neon's library when neon is named, the SME2 libraries (one shared source tree,
    # sme2_common) when any sme2 directory is.
    only = {name for name in os.environ.get("A64_LANE_ONLY", "").split(",") if name}
    if only:
        exts = [ext for ext in exts
                if (ext.backend in only if ext.backend == "neon" else any(n.startswith("sme2") for n in only))]
    out = []
    for ext in exts:
        base = backends / ext.backend if ext.backend == "neon" else backends / "sme2_common"
        common = [*(f"-D{k}={v}" for k, v in ext.define_macros),
                  *(f"-I{(base / d).resolve()}" for d in ext.include_dirs)]
        units = [Unit((base / s).resolve(), [*common, *ext.extra_compile_args], ext.objcheck.no_sme)
                 for s in ext.sources]
        units += [Unit(Path(s), [*common, *flags]) for s, flags in ext.plain.items()]
        test = None
        if ext.feature_test:
            source = tmp / f"{ext.backend}_feature_test.c"
            source.write_text(ext.feature_test)
            test = Unit(source, [*common, *ext.extra_compile_args])
        out.append(Library(ext.backend, units, test))
    return out


def symbols(objects: list[Path], *flags: str) -> set[str]:
    out = subprocess.run([NM, *flags, *map(str, objects)], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip() and not line.endswith(":")}


def main(repo: Path) -> int:
    allowed = libsystem_exports() | SME_ABI
    sys.path.insert(0, str(repo / "backends" / "arm_common"))
    import a64_objcheck

    objdump = a64_objcheck.find_objdump()
    streaming = a64_objcheck.streaming_functions(repo / "backends" / "sme2_common" / "sme2_gemm.c")
    streaming |= {"_" + name for name in streaming}  # Mach-O prefixes C names with an underscore
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for compiler, cc in compilers().items():
            for lib in libraries(repo, Path(tmp)):
                for opt in ("", "-O0"):  # the setup's own -O level, then -O0
                    objects = []
                    tests = [lib.feature_test] if lib.feature_test else []
                    for i, unit in enumerate([*tests, *lib.units]):
                        obj = Path(tmp) / f"{lib.name}-{i}{opt}.o"
                        cmd = [*cc, *unit.flags, *([opt] if opt else []), "-Werror", "-c", str(unit.source),
                               "-o", str(obj)]
                        done = subprocess.run(cmd, capture_output=True, text=True)
                        if done.returncode:
                            failures += 1
                            print(f"FAILED {compiler} {lib.name} {unit.source.name} {opt or '(setup -O)'}:")
                            print("  " + " ".join(cmd[len(cc):]))
                            print("\n".join(done.stderr.splitlines()[:15]))
                            continue
                        if unit not in tests:
                            objects.append(obj)
                            # Darwin codegen gets the same per-function SVE/SME check as the Linux build.
                            for problem in a64_objcheck.check_file(obj, objdump, streaming, unit.no_sme):
                                failures += 1
                                print(f"FAILED {compiler} {lib.name} {unit.source.name}: {problem}")
                    if len(objects) < len(lib.units):
                        continue
                    undefined = symbols(objects, "-u") - symbols(objects, "--defined-only")
                    unknown = sorted(undefined - allowed)
                    label = f"{compiler:13} {lib.name:9} {opt or 'setup -O':8}"
                    if unknown:
                        failures += 1
                        print(f"FAILED {label}: undefined symbols no Apple runtime provides: {' '.join(unknown)}")
                    else:
                        sme = sorted(undefined & SME_ABI)
                        extra = " + feature test" if tests else ""
                        print(f"ok     {label}: {len(lib.units)} sources{extra}; SME runtime: {' '.join(sme) or '-'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
