"""Whether a timed run had the machine to itself: the load average around it and its step rate against the
fastest warm-up chunk. Time-budget results (steps that fit in N seconds) mean little on a busy machine, so
such a run says so in its results instead of passing for a quiet measurement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# A run is contended when it ran this much slower than its fastest warm-up chunk (the warm-up's spread on
# a quiet machine stays within ~10%), or when more threads wanted to run than there are CPUs.
SLOWDOWN_LIMIT = 1.25


def cpus_available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable threads, this run's included), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass
class Contention:
    load_start: float | None
    load_end: float | None
    calibration_us: float  # the fastest warm-up chunk's us/step
    us_per_step: float  # what the run achieved
    cpus: int

    @property
    def slowdown(self) -> float:
        return self.us_per_step / self.calibration_us if self.calibration_us > 0 else float("nan")

    @property
    def contended(self) -> bool:
        loads = [x for x in (self.load_start, self.load_end) if x is not None]
        return self.slowdown > SLOWDOWN_LIMIT or any(load > self.cpus + 0.5 for load in loads)

    def as_record(self) -> dict[str, object]:
        return {"load_start": self.load_start, "load_end": self.load_end,
                "calibration_us_per_step": round(self.calibration_us, 3), "slowdown": round(self.slowdown, 3),
                "contended": self.contended}
