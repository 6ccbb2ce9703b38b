"""How many threads a step may use: the `threads` setting's default and its hand-off to a session.

The default is the number of physical cores this process may run on: the CPUs in its affinity mask, with
SMT siblings (hyper-threads of one core, which share its FMA units) counted once. Backends that cannot
split a step simply run on one thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .sweep import cpus

SYS_CPU = cpus.SYSFS_CPUS
# The default never exceeds this: a step holds at most 256 x 15 rows, and finer chunks than this would be
# dominated by the per-step synchronisation (a judgement, not a measurement: this machine has 2 vCPUs).
MAX_DEFAULT_THREADS = 16


def physical_cores(allowed: set[int] | None = None, sys_cpu: Path = SYS_CPU) -> int:
    """Physical cores among the CPUs this process may use (SMT siblings counted once); at least 1."""
    if allowed is None:
        allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    return max(1, len(cpus.physical_cores(allowed, sys_cpu)))


def apply_threads(session: Any, requested: int | None) -> int:
    """Ask a backend session for `requested` threads (None: the physical cores); returns the count in use.

    Sessions without `set_threads` run on one thread.
    """
    set_threads = getattr(session, "set_threads", None)
    if set_threads is None:
        return 1
    return int(set_threads(requested if requested is not None else min(physical_cores(), MAX_DEFAULT_THREADS)))
