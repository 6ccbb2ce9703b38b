"""Median us/step of numpy_ref at d_model 16/32/64/128, batch 16, on the names file the conformance kit reads.

    python backends/numpy_ref/bench_numpy.py [--steps-per-call 20] [--repeats 15] [--dtype float32]
    python backends/numpy_ref/bench_numpy.py --smoke     # seconds: d16, 2 calls of 2 steps, proves it runs

BLAS threading is pinned to one thread (set before numpy loads) because these matrices are too small to
split; pass --threads N to override.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-models", default="16,32,64,128")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps-per-call", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (d16, 2 calls of 2 steps); its timings "
                             "mean nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.d_models, args.steps_per_call, args.warmup, args.repeats = "16", 2, 1, 1
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    # Imported here so the thread settings above take effect before numpy loads its BLAS.
    import time

    import numpy as np
    from eemicrogpt_backend_numpy.session import NumpySession

    from eemicrogpt_core.backends.backend import TrainState
    from eemicrogpt_core.kit.conformance import load_names, make_batches, names_file
    from eemicrogpt_core.model.shape import ModelShape, init_params

    names = load_names()
    print(f"data: {names_file()} ({len(names.names):,} names), batch {args.batch}, {args.dtype}")
    print(f"{'d_model':>8} {'us/step':>10} {'min':>10} {'steps/s':>9}")
    n = args.steps_per_call
    for d_model in (int(x) for x in args.d_models.split(",")):
        shape = ModelShape(d_model)
        session = NumpySession(shape, args.batch, args.dtype)
        session.set_state(TrainState.fresh(init_params(shape, 0)))
        tokens, lengths = make_batches(names.names, n * (args.warmup + args.repeats), args.batch, seed=0)
        lrs = np.full(n, 1e-3, np.float32)
        times = []
        for r in range(args.warmup + args.repeats):
            sl = slice(r * n, (r + 1) * n)
            start = time.perf_counter()
            session.train_steps(tokens[sl], lengths[sl], lrs)
            if r >= args.warmup:
                times.append((time.perf_counter() - start) / n * 1e6)
        med = float(np.median(times))
        print(f"{d_model:>8} {med:>10.1f} {min(times):>10.1f} {1e6 / med:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
