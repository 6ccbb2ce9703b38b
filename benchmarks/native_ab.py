"""Interleaved A/B timing of native libraries (e.g. a baseline build against a changed one) in one process.

On a shared machine two separate bench runs see different load; here every library runs the same batches
from the same initial parameters in alternating rounds, so load hits all of them alike, and by default the
clock is the process's CPU time (`--clock cpu`: time slices lost to other processes are not counted; the
wall clock, `--clock wall`, is what `eemicrogpt bench` reports and suits a quiet machine). Prints, per cell
(d_model, batch), each library's median us/step, us/sample and % of an FP32 peak (when given), and the median
of the per-round ratios against the first library.

    python benchmarks/native_ab.py base/_emg_avx512.so new/_emg_avx512.so --sizes 16 64 --batches 16 256
    python benchmarks/native_ab.py new/_emg_avx512.so new/_emg_avx512_bf16.so --sizes 64 128 --peak 116.9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from eemicrogpt_core.backend import TrainState
from eemicrogpt_core.bench import BENCH_STREAM, heads_for, step_flops
from eemicrogpt_core.data import BatchSampler, Dataset, encode, read_names
from eemicrogpt_core.model import ModelShape, init_params
from eemicrogpt_core.native import NativeSession
from eemicrogpt_core.optim import lr_schedule


def run_cell(libs: list[str], d: int, batch: int, data: Dataset, rounds: int, target_s: float,
             threads: int, clock) -> list[tuple[list[float], float]]:
    """Per library: its us/step per round, and the mean analytic FLOPs per step."""
    shape = ModelShape(d, heads_for(d))
    sessions = [NativeSession(lib, shape, batch) for lib in libs]
    for s in sessions:
        s.set_state(TrainState.fresh(init_params(shape, 0)))
        if threads > 1:
            s.set_threads(threads)
    sampler = BatchSampler(data, batch, 0, stream=BENCH_STREAM)
    warm_tokens, warm_lengths = sampler.sample(4)
    lrs = lr_schedule(1, 4, 10**6, 1e-3)
    t0 = time.perf_counter()
    for s in sessions:
        s.train_steps(warm_tokens, warm_lengths, lrs)
    per_step = (time.perf_counter() - t0) / (4 * len(sessions))
    k = max(1, int(target_s / per_step))
    times: list[list[float]] = [[] for _ in libs]
    flops = []
    for r in range(rounds):
        tokens, lengths = sampler.sample(k)
        lrs = lr_schedule(5 + r * k, k, 10**6, 1e-3)
        flops.append(float(step_flops(shape, lengths).mean()))
        order = range(len(libs)) if r % 2 == 0 else reversed(range(len(libs)))
        for i in order:
            t0 = clock()
            sessions[i].train_steps(tokens, lengths, lrs)
            times[i].append(1e6 * (clock() - t0) / k)
    for s in sessions:
        s.close()
    return [(t, statistics.mean(flops)) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("libs", nargs="+", help="shared libraries; ratios are against the first")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--target-s", type=float, default=0.05, help="seconds per library per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--peak", type=float, default=None, help="FP32 GFLOP/s for the %% of peak column")
    parser.add_argument("--names", default=os.environ.get("EEMICROGPT_DATA", "../shared/data/names.txt"))
    args = parser.parse_args()
    data = encode(read_names(args.names).names)[0]
    print(f"clock: {args.clock}; load average before: {os.getloadavg()[0]:.2f}")
    print("d_model batch | " + " | ".join(f"{Path(lib).parent.name}/{Path(lib).stem}" for lib in args.libs))
    for d in args.sizes:
        for batch in args.batches:
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            results = run_cell(args.libs, d, batch, data, args.rounds, args.target_s, args.threads, clock)
            base = results[0][0]
            cells = []
            for times, flops in results:
                us = statistics.median(times)
                ratio = statistics.median(b / t for b, t in zip(base, times, strict=True))
                pct = f" {100 * flops / (us * 1e3) / args.peak:.1f}%" if args.peak else ""
                cells.append(f"{us:8.1f} us ({us / batch:6.2f}/sample){pct} x{ratio:.3f}")
            print(f"d{d:<3} b{batch:<4} | " + " | ".join(cells), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
