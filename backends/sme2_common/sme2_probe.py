"""Does this CPU have SME2 (and FEAT_SME_F16F16)? Asked of the OS through ctypes: no code of ours runs.

Linux: getauxval(AT_HWCAP2) bits HWCAP2_SME2 and HWCAP2_SME_F16F16, and prctl(PR_SME_GET_VL) for the
streaming vector length. macOS: sysctlbyname hw.optional.arm.FEAT_SME2 / FEAT_SME_F16F16 /
sme_max_svl_b. The FMOPA kernels are vector-length agnostic, so the length is reported, not required.
Copied by setup.py into each SME2 distribution's package as `probe.py` (see sme2_spec.py). The readers are
module-level functions so tests can replace them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from eemicrogpt_core.backends.cpu_features import (  # module-level names: tests replace them
    ARM_MACHINES,
    AT_HWCAP2,
    libc_function,
    linux_auxval,
    machine,
    macos_sysctl_int,
    os_name,
)

HWCAP2_SME2 = 1 << 37
HWCAP2_SME_F16F16 = 1 << 42
PR_SME_GET_VL = 64
PR_SME_VL_LEN_MASK = 0xFFFF
__all__ = ["ARM_MACHINES", "linux_hwcap2", "machine", "macos_sysctl_int", "os_name", "unavailable_reason"]


def linux_hwcap2() -> int:
    """The AT_HWCAP2 auxiliary vector entry of this process."""
    return linux_auxval(AT_HWCAP2)


def linux_sme_vl_bytes() -> int:
    """The streaming vector length in bytes from prctl(PR_SME_GET_VL); 0 if the kernel refuses."""
    args = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
    status = libc_function("prctl", ctypes.c_int, *args)(PR_SME_GET_VL, 0, 0, 0, 0)
    return max(status, 0) & PR_SME_VL_LEN_MASK


@dataclass(frozen=True)
class Feature:
    """One CPU feature and where each OS reports it."""

    name: str
    hwcap2_name: str
    hwcap2_bit: int
    sysctl: str
    note: str = ""


SME2 = Feature("FEAT_SME2", "HWCAP2_SME2", HWCAP2_SME2, "hw.optional.arm.FEAT_SME2")
SME_F16F16 = Feature(
    "FEAT_SME_F16F16", "HWCAP2_SME_F16F16", HWCAP2_SME_F16F16, "hw.optional.arm.FEAT_SME_F16F16",
    "; Apple M4 lacks it, M5 has it",
)


def _absent(feature: Feature, system: str) -> str | None:
    """How the OS says `feature` is missing, or None when it reports it."""
    if system == "darwin":
        return None if macos_sysctl_int(feature.sysctl) else f"this Mac: sysctl {feature.sysctl} is 0"
    if linux_hwcap2() & feature.hwcap2_bit:
        return None
    return f"this aarch64 CPU: {feature.hwcap2_name} missing from AT_HWCAP2"


def reports(feature: Feature) -> bool:
    """Does the OS report `feature` on this aarch64 machine (AT_HWCAP2 on Linux, sysctl on macOS)?"""
    return _absent(feature, "darwin" if os_name() == "darwin" else "linux") is None


def unavailable_reason(backend: str, f16f16: bool) -> str | None:
    """None when `backend` can run here, otherwise why not (a sentence starting with "<backend>:")."""
    features = (SME2, SME_F16F16) if f16f16 else (SME2,)
    arch = machine()
    if arch not in ARM_MACHINES:
        needed = " and ".join(f.name for f in features)
        return f"{backend}: requires an aarch64 CPU with {needed}; this machine is {arch}"
    system = os_name()
    if not (system.startswith("linux") or system == "darwin"):
        return f"{backend}: CPU feature detection is implemented for Linux and macOS only, not {system}"
    for feature in features:
        where = _absent(feature, "darwin" if system == "darwin" else "linux")
        if where is not None:
            return f"{backend}: requires {feature.name}, not reported ({where}){feature.note}"
    return None


def streaming_vector_bits() -> int:
    """The streaming vector length in bits (call only after unavailable_reason() said None)."""
    if os_name() == "darwin":
        return 8 * macos_sysctl_int("hw.optional.arm.sme_max_svl_b")
    return 8 * linux_sme_vl_bytes()
