"""Where the sweep's local workers run: one pinned CPU each, one per physical core first, BLAS threads 1; or,
when the runs ask for several threads per step, as many physical cores each as the most any run asks for."""

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
    per_worker: int = 1  # physical cores per worker (one CPU of each)

    @property
    def shared(self) -> bool:
        """Two workers sit on one physical core (more workers than cores)."""
        return sum(map(len, self.cpus)) > self.n_cores

    def describe(self) -> str:
        where = ", ".join(f"cpu {','.join(map(str, c))}" for c in self.cpus)
        n = len(self.cpus)
        cores = f"{self.n_cores} physical core{'s' * (self.n_cores != 1)}"
        each = f", {self.per_worker} cores each for runs of up to {self.per_worker} threads" if self.per_worker > 1 \
            else ""
        text = f"{n} worker{'s' * (n != 1)} on {cores}{each}, pinned to {where}, BLAS threads 1"
        if self.shared:
            text += ("; WORKERS SHARE A CORE (more workers than physical cores): time-budget runs get fewer steps "
                     "and us/step reads slower")
        return text


def place_workers(n: int | None, cores: list[list[int]], per_worker: int = 1) -> Placement:
    """n workers, each pinned to `per_worker` physical cores (capped at the cores there are).

    One core each (the default: one worker per physical core): one logical CPU each, first one per core, then
    the SMT siblings, then round-robin, so cores are shared only when n exceeds the core count. Several cores
    each (runs of several threads): the first CPU of consecutive cores, len(cores) // per_worker workers by
    default, round-robin over those groups beyond."""
    if not cores:
        raise ValueError("no usable CPU")
    per_worker = max(1, min(per_worker, len(cores)))
    if per_worker > 1:
        groups = [[core[0] for core in cores[i:i + per_worker]]
                  for i in range(0, len(cores) - per_worker + 1, per_worker)]
        n = len(groups) if n is None else n
        return Placement([groups[i % len(groups)] for i in range(n)], len(cores), per_worker)
    n = len(cores) if n is None else n
    order = [cpu for depth in range(max(map(len, cores))) for core in cores if depth < len(core)
             for cpu in [core[depth]]]
    cpus = [[order[i % len(order)]] for i in range(n)]
    return Placement(cpus, len(cores))
