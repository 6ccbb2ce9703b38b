"""CPU topology from Linux sysfs: which usable CPUs share a physical core (SMT siblings count once).

The `threads` default (threads.py) and the sweep's worker placement (sweep/placement.py) both count cores
this way. Where sysfs cannot be read (other systems), each CPU counts as its own core.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> list[int]:
    """Linux's cpu list format: '0-3,8,10-11'."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def usable_cpus() -> set[int]:
    """The CPUs this process may run on: its affinity mask, or every CPU where the OS has none (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def physical_cores(allowed: set[int] | None = None, root: Path = SYSFS_CPUS) -> list[list[int]]:
    """The usable CPUs grouped by physical core (each group: SMT siblings, lowest first).

    A CPU whose topology cannot be read counts as its own core.
    """
    allowed = usable_cpus() if allowed is None else allowed
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in sorted(allowed):
        topo = root / f"cpu{cpu}" / "topology"
        key: tuple[int, ...] = (cpu,)
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                key = tuple(parse_cpu_list((topo / name).read_text()))
                break
            except (OSError, ValueError):
                continue
        cores.setdefault(key, []).append(cpu)
    return sorted(cores.values())


def physical_core_count(allowed: set[int] | None = None, root: Path = SYSFS_CPUS) -> int:
    """How many physical cores the usable CPUs span; at least 1."""
    return max(1, len(physical_cores(allowed, root)))
