"""How a native library's step cost grows with depth and context, measured side by side in one process.

Per width, four cells on synthetic names (lengths uniform in 1..context, `bench.synthetic_data`) run in
interleaved rounds, so machine noise hits all of them alike:

    L1 C32, L2 C32   -> the cost of a second layer (ratio of us/step)
    L1 C16, L1 C64   -> the cost per live position at a long context against a short one

Each cell prints the median us/step, its analytic GFLOP/s (`bench.step_flops`) and % of `--peak` (default:
this machine's FP32 FMA peak, measured by the x86 plugin in the same run), and us per live position (a live
position is a predicted token). The clock is the process's CPU time (`--clock wall` for a quiet machine).

    LIB=$(python -c 'from eemicrogpt_backend_x86.libs import library_path; print(library_path("avx512"))')
    python benchmarks/shape_scaling.py "$LIB" --sizes 64 128 --vocab 64 --threads 1 --rounds 15
    python benchmarks/shape_scaling.py "$LIB" --smoke      # seconds: proves the script runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import NativeSession
from eemicrogpt_core.data.names import BatchSampler
from eemicrogpt_core.model.optim import lr_schedule
from eemicrogpt_core.model.shape import init_params
from eemicrogpt_core.tools.bench import BENCH_STREAM, Form, step_flops, synthetic_data


@dataclass
class Cell:
    label: str
    form: Form
    us: list[float]
    gflop: list[float]  # analytic GFLOP per step, per round
    live: list[float]  # live positions per step, per round

    def median_us(self) -> float:
        return statistics.median(self.us)

    def us_per_position(self) -> float:
        return statistics.median(u / p for u, p in zip(self.us, self.live, strict=True))

    def gflops(self) -> float:
        return statistics.median(g / (u * 1e-6) for g, u in zip(self.gflop, self.us, strict=True))


def cells_for(vocab: int) -> list[Cell]:
    forms = {"L1 C32": Form(1, vocab, 32), "L2 C32": Form(2, vocab, 32), "L1 C16": Form(1, vocab, 16),
             "L1 C64": Form(1, vocab, 64)}
    return [Cell(label, form, [], [], []) for label, form in forms.items()]


def measure(lib: str, d_model: int, vocab: int, batch: int, rounds: int, target_s: float, threads: int,
            clock) -> list[Cell]:
    cells = cells_for(vocab)
    runs = []
    for cell in cells:
        shape = cell.form.shape(d_model)
        session = NativeSession(lib, shape, batch)
        session.set_state(TrainState.fresh(init_params(shape, 0)))
        if threads > 1:
            session.set_threads(threads)
        sampler = BatchSampler(synthetic_data(cell.form), batch, 0, stream=BENCH_STREAM)
        tokens, lengths = sampler.sample(4)  # warm-up, and the per-step estimate
        t0 = time.perf_counter()
        session.train_steps(tokens, lengths, lr_schedule(1, 4, 10**6, 1e-3))
        k = max(1, int(target_s / ((time.perf_counter() - t0) / 4)))
        runs.append((cell, session, sampler, k))
    for r in range(rounds):
        order = runs if r % 2 == 0 else runs[::-1]
        for cell, session, sampler, k in order:
            tokens, lengths = sampler.sample(k)
            lrs = lr_schedule(5 + r * k, k, 10**6, 1e-3)  # small LR: the weights stay sane for any length
            t0 = clock()
            session.train_steps(tokens, lengths, lrs)
            cell.us.append(1e6 * (clock() - t0) / k)
            cell.gflop.append(float(step_flops(cell.form.shape(d_model), lengths).mean()) / 1e9)
            cell.live.append(float((lengths.astype(np.float64) - 1).sum(axis=-1).mean()))
    for _, session, _, _ in runs:
        session.close()
    return cells


def measured_peak(seconds: float) -> float | None:
    try:
        from eemicrogpt_backend_x86.plugin import eemicrogpt_peak_gflops
    except ImportError:
        return None
    return eemicrogpt_peak_gflops("fp32", seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib", help="a native library (ABI version 2)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--target-s", type=float, default=0.05, help="seconds per cell per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--peak", type=float, default=None, help="GFLOP/s for %% of peak (default: measured)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (d16, vocab 27, batch 4, 2 short rounds, a "
                             "short peak measurement); its timings mean nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.vocab, args.batch, args.rounds, args.target_s = [16], 27, 4, 2, 0.001
    peak = args.peak if args.peak is not None else measured_peak(0.02 if args.smoke else 0.5)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"library {args.lib}; clock {args.clock}; batch {args.batch}; threads {args.threads}; vocab {args.vocab}; "
          f"peak {f'{peak:.1f} GFLOP/s' if peak else 'unknown'}; load average {os.getloadavg()[0]:.2f}")
    for d in args.sizes:
        cells = measure(args.lib, d, args.vocab, args.batch, args.rounds, args.target_s, args.threads, clock)
        for cell in cells:
            pct = f"{100 * cell.gflops() / peak:5.1f}% of peak" if peak else ""
            print(f"d{d:<3} {cell.label}: {cell.median_us():9.1f} us/step  {cell.gflops():6.1f} GFLOP/s {pct}  "
                  f"{1e3 * cell.us_per_position():7.1f} ns per live position")
        by = {c.label: c for c in cells}
        layers = statistics.median(b / a for a, b in zip(by["L1 C32"].us, by["L2 C32"].us, strict=True))
        position = by["L1 C64"].us_per_position() / by["L1 C16"].us_per_position()
        print(f"d{d:<3} 2 layers / 1 layer: x{layers:.3f} per step; per live position, context 64 / 16: "
              f"x{position:.3f}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
