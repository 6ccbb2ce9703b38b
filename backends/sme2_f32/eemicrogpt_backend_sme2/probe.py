"""Does this CPU have SME2 (and FEAT_SME_F16F16)? Asked of the OS through ctypes: no code of ours runs.

Linux: getauxval(AT_HWCAP2) bits HWCAP2_SME2 and HWCAP2_SME_F16F16, and prctl(PR_SME_GET_VL) for the
streaming vector length. macOS: sysctlbyname hw.optional.arm.FEAT_SME2 / FEAT_SME_F16F16 /
sme_max_svl_b. The FMOPA kernels are vector-length agnostic, so the length is reported, not required.
Shared by sme2_f32 and sme2_f16 (which depends on this distribution). The readers are module-level
functions so tests can replace them.
"""

from __future__ import annotations

import ctypes
import platform
import sys

AT_HWCAP2 = 26
HWCAP2_SME2 = 1 << 37
HWCAP2_SME_F16F16 = 1 << 42
PR_SME_GET_VL = 64
PR_SME_VL_LEN_MASK = 0xFFFF
ARM_MACHINES = ("aarch64", "arm64")


def machine() -> str:
    return platform.machine().lower() or "unknown"


def os_name() -> str:
    return sys.platform


def _libc_function(name: str, restype: type, *argtypes: type):
    """A libc function with its C signature declared (ctypes would assume int everywhere)."""
    function = getattr(ctypes.CDLL(None), name)
    function.restype, function.argtypes = restype, list(argtypes)
    return function


def linux_hwcap2() -> int:
    """The AT_HWCAP2 auxiliary vector entry of this process."""
    # c_ulong, not the default c_int: HWCAP2_SME2 is bit 37 and would be cut off.
    return int(_libc_function("getauxval", ctypes.c_ulong, ctypes.c_ulong)(AT_HWCAP2))


def linux_sme_vl_bytes() -> int:
    """The streaming vector length in bytes from prctl(PR_SME_GET_VL); 0 if the kernel refuses."""
    args = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
    status = _libc_function("prctl", ctypes.c_int, *args)(PR_SME_GET_VL, 0, 0, 0, 0)
    return max(status, 0) & PR_SME_VL_LEN_MASK


def macos_sysctl_int(name: str) -> int:
    """sysctlbyname() as an integer; 0 when the key does not exist (how macOS says "feature absent")."""
    system = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    out, out_size = ctypes.c_int64(0), ctypes.c_size_t(8)
    failed = system.sysctlbyname(ctypes.c_char_p(name.encode()), ctypes.byref(out), ctypes.byref(out_size), None, 0)
    return 0 if failed else out.value


def _needs(f16f16: bool) -> str:
    return "FEAT_SME2 and FEAT_SME_F16F16" if f16f16 else "FEAT_SME2"


def unavailable_reason(backend: str, f16f16: bool) -> str | None:
    """None when `backend` can run here, otherwise why not (a sentence starting with "<backend>:")."""
    arch = machine()
    if arch not in ARM_MACHINES:
        return f"{backend}: requires an aarch64 CPU with {_needs(f16f16)}; this machine is {arch}"
    system = os_name()
    if system.startswith("linux"):
        hwcap2 = linux_hwcap2()
        if not hwcap2 & HWCAP2_SME2:
            return f"{backend}: this aarch64 CPU does not report SME2 (HWCAP2_SME2 missing from AT_HWCAP2)"
        if f16f16 and not hwcap2 & HWCAP2_SME_F16F16:
            return (
                f"{backend}: this CPU has SME2 but not FEAT_SME_F16F16 (HWCAP2_SME_F16F16 missing from "
                "AT_HWCAP2); Apple M4 lacks it, M5 has it"
            )
        return None
    if system == "darwin":
        if not macos_sysctl_int("hw.optional.arm.FEAT_SME2"):
            return f"{backend}: this Mac does not report SME2 (sysctl hw.optional.arm.FEAT_SME2 is 0)"
        if f16f16 and not macos_sysctl_int("hw.optional.arm.FEAT_SME_F16F16"):
            return (
                f"{backend}: this Mac has SME2 but not FEAT_SME_F16F16 (sysctl "
                "hw.optional.arm.FEAT_SME_F16F16 is 0); Apple M4 lacks it, M5 has it"
            )
        return None
    return f"{backend}: CPU feature detection is implemented for Linux and macOS only, not {system}"


def streaming_vector_bits() -> int:
    """The streaming vector length in bits (call only after unavailable_reason() said None)."""
    if os_name() == "darwin":
        return 8 * macos_sysctl_int("hw.optional.arm.sme_max_svl_b")
    return 8 * linux_sme_vl_bytes()
