"""Read CPU facts from the OS through ctypes, for backend probes: no native code of ours runs.

Probes must never execute an instruction the CPU may lack, so they ask the kernel (Linux getauxval) or
the system (macOS sysctlbyname) instead of trying an instruction. Backend probe modules import these
readers as module-level names, so tests can replace them per module.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any

AT_HWCAP = 16
AT_HWCAP2 = 26
ARM_MACHINES = ("aarch64", "arm64")


def machine() -> str:
    return platform.machine().lower() or "unknown"


def os_name() -> str:
    return sys.platform


def libc_function(name: str, restype: type, *argtypes: type) -> Any:
    """A libc function with its C signature declared (ctypes would assume int everywhere)."""
    function = getattr(ctypes.CDLL(None), name)
    function.restype, function.argtypes = restype, list(argtypes)
    return function


def linux_auxval(kind: int) -> int:
    """getauxval(kind), e.g. AT_HWCAP or AT_HWCAP2, as an unsigned 64-bit value."""
    # c_ulong, not ctypes' default c_int: HWCAP2 bits >= 32 (SME2 is bit 37) would be cut off.
    return int(libc_function("getauxval", ctypes.c_ulong, ctypes.c_ulong)(kind))


def macos_sysctl_int(name: str) -> int:
    """An integer sysctl; a missing key reads as 0 (how macOS says "feature absent")."""
    system = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    value, size = ctypes.c_int64(0), ctypes.c_size_t(8)
    failed = system.sysctlbyname(ctypes.c_char_p(name.encode()), ctypes.byref(value), ctypes.byref(size), None, 0)
    return 0 if failed else int(value.value)
