"""Does this CPU have Advanced SIMD (Neon)? Asked of the OS through ctypes: no code of ours runs natively.

Linux: getauxval(AT_HWCAP) must report HWCAP_ASIMD; the kernels are built for Armv8.0-A and use no FP16
instruction, so Cortex-A72 (Raspberry Pi 4, Graviton 1) qualifies. macOS: sysctlbyname("hw.optional.AdvSIMD")
(every Apple silicon core is Armv8.4 or later). The readers are
module-level functions so tests can replace them (QEMU cannot remove Advanced SIMD from an aarch64 CPU).
"""

from __future__ import annotations

from eemicrogpt_core.backends.cpu_features import (  # module-level names: tests replace them
    ARM_MACHINES,
    AT_HWCAP,
    linux_auxval,
    machine,
    macos_sysctl_int,
    os_name,
)

HWCAP_ASIMD = 1 << 1
__all__ = ["ARM_MACHINES", "linux_hwcap", "machine", "macos_sysctl_int", "os_name", "unavailable_reason"]


def linux_hwcap() -> int:
    """The AT_HWCAP auxiliary vector entry of this process."""
    return linux_auxval(AT_HWCAP)


def unavailable_reason() -> str | None:
    """None when Advanced SIMD is usable here, otherwise why not (a sentence starting with "neon:")."""
    arch = machine()
    if arch not in ARM_MACHINES:
        return f"neon: requires an aarch64 CPU with Advanced SIMD; this machine is {arch}"
    system = os_name()
    if system.startswith("linux"):
        if not linux_hwcap() & HWCAP_ASIMD:
            return "neon: this aarch64 CPU does not report Advanced SIMD (HWCAP_ASIMD missing from AT_HWCAP)"
        return None
    if system == "darwin":
        if not macos_sysctl_int("hw.optional.AdvSIMD"):
            return "neon: this Mac does not report Advanced SIMD (sysctl hw.optional.AdvSIMD is 0)"
        return None
    return f"neon: CPU feature detection is implemented for Linux and macOS only, not {system}"
