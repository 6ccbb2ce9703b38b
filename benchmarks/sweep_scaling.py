"""Local sweep executor: N workers against 1 on a fixed-steps sweep, and the per-run overhead.

    python benchmarks/sweep_scaling.py [--runs 8] [--steps 4000] [--d-model 16] [--repeats 2] [--data names.txt]
    python benchmarks/sweep_scaling.py --smoke     # seconds: 2 runs of 3 steps on 2 workers, proves it runs

Speed-up: wall time of the whole sweep with 1 worker over wall time with N (default: one per physical core);
target >= 0.9 N. Fixed steps, so both sweeps do the same work; each repeat runs 1 worker and N workers back to
back (interleaved) and the median is reported.
Per-run overhead: everything but training steps, i.e. (sweep wall time - sum of the runs' time inside the
backend's train_steps) / runs on one worker, which counts worker start-up, data loading, validation,
checkpoints and result bookkeeping; target < 0.5 s. A second figure times a sweep of 1-step runs (no eval
worth mentioning) to show the fixed cost alone.
On a machine shared with other work both figures are pessimistic: the load average is printed alongside.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from eemicrogpt_core.backends.topology import physical_cores
from eemicrogpt_core.data.datafile import ENV_VAR
from eemicrogpt_core.sweep.driver import prepare_runs, run_sweep
from eemicrogpt_core.sweep.local import LocalExecutor
from eemicrogpt_core.sweep.progress import SweepProgress
from eemicrogpt_core.sweep.spec import parse_spec


def timed_sweep(spec_data: dict, workers: int, data: str | None) -> tuple[float, list[dict]]:
    spec = parse_spec(spec_data, "benchmark spec")
    runs = prepare_runs(spec, None, data)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        outcome = run_sweep(spec, runs, Path(tmp) / "sweep", LocalExecutor(workers),
                            SweepProgress(Console(quiet=True)))
        wall = time.perf_counter() - t0
    bad = [r for r in outcome.rows if r.get("status") != "done"]
    if bad:
        sys.exit(f"benchmark sweep had unfinished runs: {bad[0]}")
    return wall, outcome.rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="N (default: one per physical core)")
    parser.add_argument("--data", default=os.environ.get(ENV_VAR))
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (2 runs of 3 steps, 1 repeat, 2 workers); "
                             "its timings mean nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.steps, args.repeats, args.workers = 2, 3, 1, 2
    n = args.workers or len(physical_cores())
    base = {"d_model": args.d_model, "backend": args.backend, "log_every": max(args.steps // 4, 1),
            "steps": args.steps}
    spec = {"base": base, "seeds": list(range(args.runs))}
    print(f"{args.runs} runs of {args.steps} steps at d{args.d_model} ({args.backend}); N = {n} workers "
          f"({len(physical_cores())} physical cores); load average before: {os.getloadavg()[0]:.2f}")
    one, many, overhead = [], [], []
    for _ in range(args.repeats):
        wall1, rows = timed_sweep(spec, 1, args.data)
        walln, _ = timed_sweep(spec, n, args.data)
        one.append(wall1)
        many.append(walln)
        overhead.append((wall1 - sum(r["train_s"] for r in rows)) / len(rows))
    t1, tn = statistics.median(one), statistics.median(many)
    speedup = t1 / tn
    fixed_spec = {"base": {**base, "steps": 1, "log_every": 1, "eval_batches": 1}, "seeds": list(range(args.runs))}
    wall_fixed, _ = timed_sweep(fixed_spec, 1, args.data)
    per_run_overhead = statistics.median(overhead)
    print(f"1 worker: {t1:.2f} s, {n} workers: {tn:.2f} s -> speed-up {speedup:.2f}x "
          f"({speedup / n:.2f} N; target >= 0.9 N)")
    print(f"per-run overhead (wall - time in train_steps, 1 worker): {per_run_overhead:.3f} s (target < 0.5 s)")
    print(f"1-step runs, 1 worker: {wall_fixed / args.runs:.3f} s per run (includes worker start-up once)")
    print(f"load average after: {os.getloadavg()[0]:.2f} (other work on the machine slows the N-worker sweep)")


if __name__ == "__main__":
    main()
