"""Where the sweep's local workers run: one pinned CPU each, one per physical core first, BLAS threads 1."""

from __future__ import annotations

from dataclasses import dataclass

# Set in each worker's environment before numpy loads: one BLAS/OpenMP thread per worker, as pinned.
THREAD_ENV_VARS = (
    "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


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
