"""Print the backends this machine must run, comma separated, for EEMICROGPT_REQUIRE_BACKENDS.

A backend is required when the CPU and OS can run it, as its own probe's CPU readers say (CPUID/XGETBV
for x86, getauxval/sysctl for ARM). The conformance kit then fails, instead of skipping, a required
backend that is unavailable for any other reason: a library that did not build or load, a missing
package. Portable backends (numpy_ref, the C and Python examples) are always required. The reasons go to stderr.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator

from eemicrogpt_core.backends.cpu_features import ARM_MACHINES, machine

X86_MACHINES = ("x86_64", "amd64")
PORTABLE = ("numpy_ref", "example_c", "example_py")


def _module(name: str, package: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        sys.exit(f"required_backends: {package} is not installed on this {machine()} machine ({e})")


def x86_verdicts() -> Iterator[tuple[str, str | None]]:
    probe = _module("eemicrogpt_backend_x86.probe", "eemicrogpt-backend-x86")
    for name in probe.VARIANTS:
        try:
            yield name, probe.cpu_lacks(name)
        except OSError as e:  # the CPUID library is missing or will not load: the variant must run, and fail
            print(f"  {name}: the CPU cannot be read ({e}); requiring it", file=sys.stderr)
            yield name, None


def arm_verdicts() -> Iterator[tuple[str, str | None]]:
    neon = _module("eemicrogpt_backend_neon.probe", "eemicrogpt-backend-neon")
    sme2 = _module("eemicrogpt_backend_sme2.probe", "eemicrogpt-backend-sme2")
    yield "neon", neon.unavailable_reason()
    yield "sme2_f32", sme2.unavailable_reason("sme2_f32", f16f16=False)
    yield "sme2_f16", sme2.unavailable_reason("sme2_f16", f16f16=True)
    yield "sme2_f16w", sme2.unavailable_reason("sme2_f16w", f16f16=False)  # widening fp16 FMOPA: base SME


def required() -> list[str]:
    families: dict[tuple[str, ...], Callable[[], Iterator[tuple[str, str | None]]]] = {
        X86_MACHINES: x86_verdicts,
        ARM_MACHINES: arm_verdicts,
    }
    names = list(PORTABLE)
    for machines, verdicts in families.items():
        if machine() not in machines:
            continue
        for name, lacks in verdicts():
            if lacks is None:
                names.append(name)
            else:
                print(f"  not required here: {lacks}", file=sys.stderr)
    return names


if __name__ == "__main__":
    print(",".join(required()))
