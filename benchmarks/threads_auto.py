"""threads: auto against fixed thread counts, on a quiet machine and with one core taken by a busy loop.

For each scene (quiet; a busy process pinned to the last CPU of this process's affinity mask) and each
setting (the default `auto`, then `--threads 1` and `--threads 2`), the same training run (`eemicrogpt
train`'s loop through the Python trainer, no run directory) is timed; settings alternate within each of
`--rounds` rounds, so a slow host window hits all of them. Prints the median us/step of each setting, the
default's ratio to the better fixed count, and what auto picked. Targets (the project's): with a core taken,
auto within 10% of the better of 1 and 2 threads; quiet, within 3% of 2 threads.

    python benchmarks/threads_auto.py                       # d64, batch 16, 4,000 steps, avx512 or avx2
    python benchmarks/threads_auto.py --d-model 16 --steps 20000 --rounds 3
    python benchmarks/threads_auto.py --smoke      # seconds: proves the script runs (the busy loop included)
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.training.config import TrainConfig, preset
from eemicrogpt_core.training.trainer import NullReporter, train

SETTINGS: dict[str, int | None] = {"auto": None, "1 thread": 1, "2 threads": 2}


class Picks(NullReporter):
    """Keeps what threads: auto said."""

    def __init__(self) -> None:
        self.picks: list[str] = []

    def message(self, text: str) -> None:
        if text.startswith("threads: auto picked"):
            self.picks.append(text.split(" (")[0].removeprefix("threads: auto picked "))


def _spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


@contextmanager
def busy_core(cpu: int) -> Iterator[None]:
    """A process spinning on `cpu` for the duration."""
    proc = multiprocessing.Process(target=_spin, args=(cpu,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        proc.terminate()
        proc.join()


def timed_run(cfg: TrainConfig, threads: int | None) -> tuple[float, list[str]]:
    reporter = Picks()
    result = train(dataclasses.replace(cfg, threads=threads), load_registry(), reporter=reporter)
    return result.us_per_step, reporter.picks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--data", default=os.environ.get("EEMICROGPT_DATA", "../shared/data/names.txt"))
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (d16, 5 steps, 1 round); its timings mean "
                             "nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.d_model, args.steps, args.rounds = 16, 5, 1
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        parser.error("needs at least 2 CPUs in the affinity mask")
    base = preset(args.d_model) if args.d_model in (16, 32, 64, 128) else TrainConfig(d_model=args.d_model)
    cfg = dataclasses.replace(base, steps=args.steps, data=args.data, backend=args.backend,
                              log_every=args.steps, eval_batches=1)
    print(f"d{args.d_model}, batch {cfg.batch}, {args.steps:,} steps, backend {args.backend}, "
          f"{args.rounds} rounds; CPUs {cpus}; load average {os.getloadavg()[0]:.2f}")
    for scene in ("quiet", f"busy loop on CPU {cpus[-1]}"):
        times: dict[str, list[float]] = {name: [] for name in SETTINGS}
        picks: list[str] = []
        with busy_core(cpus[-1]) if scene != "quiet" else nullcontext():
            for r in range(args.rounds):
                order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
                for name in order:
                    us, said = timed_run(cfg, SETTINGS[name])
                    times[name].append(us)
                    if name == "auto":
                        picks.append("->".join(said) or "-")
        med = {name: statistics.median(t) for name, t in times.items()}
        best = min(med["1 thread"], med["2 threads"])
        cells = ", ".join(f"{name} {med[name]:,.1f}" for name in SETTINGS)
        print(f"{scene}: us/step {cells}; auto / best fixed x{med['auto'] / best:.3f}, auto / 2 threads "
              f"x{med['auto'] / med['2 threads']:.3f}; auto picked {', '.join(picks)}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
