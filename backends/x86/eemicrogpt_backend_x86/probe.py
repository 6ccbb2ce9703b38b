"""Can this machine run a variant? CPUID/XGETBV results come from a library built without target flags."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from eemicrogpt_core.backends.backend import ProbeResult
from eemicrogpt_core.backends.native import library_load_error

from .libs import extras, library_path

DISABLE_ENV = "EEMICROGPT_X86_DISABLE"

# Bit order of emg_x86_cpu_features() in csrc/probe.c.
FEATURE_BITS = {
    "AVX": 1 << 0,
    "FMA": 1 << 1,
    "AVX2": 1 << 2,
    "AVX512F": 1 << 3,
    "AVX512VL": 1 << 4,
    "AVX512BW": 1 << 5,
    "AVX512DQ": 1 << 6,
    "AVX512BF16": 1 << 9,
    "AMX_BF16": 1 << 10,  # AMX-TILE and AMX-BF16
}
OS_YMM, OS_ZMM, OS_AMX = 1 << 7, 1 << 8, 1 << 11


@dataclass(frozen=True)
class Variant:
    name: str
    features: tuple[str, ...]  # CPUID features the compiled code may use
    os_state: int  # XCR0 state the OS must save
    os_state_name: str
    score: int  # `auto` ranks backends of the requested precision by score
    precision: str = "fp32"  # what the matrix products compute in (BackendSpec.precision)


VARIANTS = {
    "avx512": Variant("avx512", ("AVX", "AVX2", "FMA", "AVX512F", "AVX512VL", "AVX512BW", "AVX512DQ"), OS_ZMM,
                      "zmm", 100),
    "avx2": Variant("avx2", ("AVX", "AVX2", "FMA"), OS_YMM, "ymm", 50),
    "avx512_bf16": Variant("avx512_bf16", ("AVX", "AVX2", "FMA", "AVX512F", "AVX512VL", "AVX512BW", "AVX512DQ",
                                           "AVX512BF16"), OS_ZMM, "zmm", 100, "bf16"),
    # Ahead of avx512_bf16 where both run: 1.8-3.3x its speed on an Intel Xeon (backends/x86/README.md).
    "amx_bf16": Variant("amx_bf16", ("AVX", "AVX2", "FMA", "AVX512F", "AVX512VL", "AVX512BW", "AVX512DQ",
                                     "AVX512BF16", "AMX_BF16"), OS_AMX, "zmm and AMX tile", 110, "bf16"),
}
# A variant name in EEMICROGPT_X86_DISABLE masks the features that set it apart.
_NAME_MASKS = {"avx512": ("AVX512F", "AVX512VL", "AVX512BW", "AVX512DQ"), "avx2": ("AVX2",),
               "avx512_bf16": ("AVX512BF16",), "amx_bf16": ("AMX_BF16",)}


def disabled_features(env: str | None = None) -> set[str]:
    """Features masked by EEMICROGPT_X86_DISABLE (comma/space separated feature or variant names)."""
    raw = os.environ.get(DISABLE_ENV, "") if env is None else env
    out: set[str] = set()
    for word in raw.replace(",", " ").split():
        key = word.strip()
        if key.lower() in _NAME_MASKS:
            out.update(_NAME_MASKS[key.lower()])
        elif key.upper() in FEATURE_BITS:
            out.add(key.upper())
        else:
            known = ", ".join([*_NAME_MASKS, *FEATURE_BITS])
            raise ValueError(f"{DISABLE_ENV}: unknown feature {word!r}; known: {known}")
    return out


def cpu_features() -> int:
    """The raw CPUID/XGETBV bit set (0 off x86)."""
    ffi, lib = extras("probe")
    del ffi
    return int(lib.emg_x86_cpu_features())


def cpu_lacks(name: str) -> str | None:
    """Why this CPU (or OS, or EEMICROGPT_X86_DISABLE) rules out the variant, or None when it does not.

    Needs the probe library; the test command also uses it to decide which variants must run here.
    """
    variant = VARIANTS[name]
    bits = cpu_features()
    masked = disabled_features()
    missing = [f for f in variant.features if not bits & FEATURE_BITS[f] or f in masked]
    if missing:
        why = " (masked by " + DISABLE_ENV + ")" if any(f in masked for f in missing) else ""
        return f"{name}: CPU lacks {', '.join(missing)}{why}"
    if not bits & variant.os_state:
        return f"{name}: the OS does not enable {variant.os_state_name} register state (XCR0)"
    return None


def probe(name: str) -> ProbeResult:
    variant = VARIANTS[name]
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return ProbeResult.no(f"{name}: requires an x86_64 CPU; this machine is {platform.machine() or 'unknown'}")
    path = library_path(name)
    if library_path("probe") is None or path is None:
        return ProbeResult.no(
            f"{name}: the native library was not built (reinstall eemicrogpt-backend-x86 with a C compiler)"
        )
    lacks = cpu_lacks(name)
    if lacks:
        return ProbeResult.no(lacks)
    # Last, on a CPU that runs it: a library built for another ABI version is unavailable, not a crash later.
    if (error := library_load_error(path)) is not None:
        return ProbeResult.no(f"{name}: {error}")
    note = f"{name}: {'/'.join(variant.features)} detected"
    if variant.precision != "fp32":
        note += f" (reduced precision: auto picks it only when asked for {variant.precision})"
    return ProbeResult.ok(variant.score, note)
