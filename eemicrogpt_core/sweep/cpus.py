"""Physical cores from Linux sysfs: SMT siblings count once, so time-budget runs never share a core."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")

# Set in each worker's environment before numpy loads: one BLAS/OpenMP thread per worker, as pinned.
THREAD_ENV_VARS = (
    "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def parse_cpu_list(text: str) -> list[int]:
    """Linux's cpu list format: '0-3,8,10-11'."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def physical_cores(allowed: set[int] | None = None, root: Path = SYSFS_CPUS) -> list[list[int]]:
    """The usable CPUs grouped by physical core (each group: SMT siblings, lowest first).

    A CPU whose topology cannot be read counts as its own core.
    """
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
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


@dataclass(frozen=True)
class Placement:
    cpus: list[list[int]]  # per worker, the CPUs it is pinned to
    n_cores: int  # physical cores available

    @property
    def shared(self) -> bool:
        """Two workers sit on one physical core (more workers than cores)."""
        return len(self.cpus) > self.n_cores

    def describe(self) -> str:
        where = ", ".join(f"cpu {','.join(map(str, c))}" for c in self.cpus)
        n = len(self.cpus)
        cores = f"{self.n_cores} physical core{'s' * (self.n_cores != 1)}"
        text = f"{n} worker{'s' * (n != 1)} on {cores}, pinned to {where}, BLAS threads 1"
        if self.shared:
            text += ("; WORKERS SHARE A CORE (more workers than physical cores): time-budget runs get fewer steps "
                     "and us/step reads slower")
        return text


def place_workers(n: int | None, cores: list[list[int]]) -> Placement:
    """n workers (default: one per physical core), each pinned to one logical CPU; first one per core, then
    the SMT siblings, then round-robin, so cores are shared only when n exceeds the core count."""
    if not cores:
        raise ValueError("no usable CPU")
    n = len(cores) if n is None else n
    order = [cpu for depth in range(max(map(len, cores))) for core in cores if depth < len(core)
             for cpu in [core[depth]]]
    cpus = [[order[i % len(order)]] for i in range(n)]
    return Placement(cpus, len(cores))
