"""Interleaved A/B timing of native libraries (e.g. a baseline build against a changed one) in one process.

On a shared machine two separate bench runs see different load; here every library runs the same batches
from the same initial parameters in alternating rounds, so load hits all of them alike, and by default the
clock is the process's CPU time (`--clock cpu`: time slices lost to other processes are not counted; the
wall clock, `--clock wall`, is what `eemicrogpt bench` reports and suits a quiet machine). Prints, per cell
(d_model, batch), each library's median us/step, us/sample and % of an FP32 peak (when given), and the median
of the per-round ratios against the first library.

A library built for ABI version 1 (one layer, the names' 27 tokens, rows of 16 tokens: at most 15
predictions) runs too, so a build from before version 2 can be the baseline: with one among the libraries,
the cells use the shape both versions share (one layer, vocabulary 27, context 16, whose parameter layout is
version 1's) and every library gets the same batches cut to 16 tokens per row, the same live positions.
A library built for ABI version 2 (uint8 lengths, no optimiser settings) runs any shape of its own bounds,
with the default optimiser, which is what version 3's default step computes.

    python benchmarks/native_ab.py base/_emg_avx512.so new/_emg_avx512.so --sizes 16 64 --batches 16 256
    python benchmarks/native_ab.py new/_emg_avx512.so new/_emg_avx512_bf16.so --sizes 64 128 --peak 116.9
    python benchmarks/native_ab.py new/_emg_avx512.so --sizes 64 128 --n-layers 2 --context 32
    python benchmarks/native_ab.py base/_emg_avx512.so new/_emg_avx512.so --shape recipe full --rounds 5
    python benchmarks/native_ab.py new/_emg_avx512.so new/_emg_avx512.so --smoke   # seconds: proves it runs

`--shape` (recipe, full or d_model,heads,layers,vocab,context,batch, as `eemicrogpt bench --shape`) times
whole shapes on random full-length windows, as text training feeds a step, instead of --sizes x --batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

import cffi
import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import NativeSession
from eemicrogpt_core.data.names import BatchSampler, Dataset, encode, read_names
from eemicrogpt_core.model.optim import lr_schedule
from eemicrogpt_core.model.shape import DEFAULT_CONTEXT, NAMES_VOCAB, ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.tools.bench import BENCH_STREAM, Form, full_windows, parse_shape, step_flops, synthetic_data

V1_SEQ = 16  # tokens per row in ABI version 1
# ABI version 1's functions as its header declared them (only those this script calls).
V1_CDEF = """
typedef struct emg_session emg_session;
int emg_abi_version(void);
int emg_create(int d_model, int n_heads, int max_batch, emg_session **out);
void emg_destroy(emg_session *s);
int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v, int64_t step);
int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens, const uint8_t *lengths,
                    const float *lrs, float *losses);
int emg_set_threads(emg_session *s, int n_threads);
"""
# ABI version 2's: version 3's shape, lengths as uint8.
V2_CDEF = """
typedef struct emg_shape {
    int32_t d_model; int32_t n_heads; int32_t n_layers; int32_t vocab; int32_t context;
} emg_shape;
typedef struct emg_session emg_session;
int emg_abi_version(void);
int emg_create(const emg_shape *shape, int max_batch, emg_session **out);
void emg_destroy(emg_session *s);
int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v, int64_t step);
int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens, const uint8_t *lengths,
                    const float *lrs, float *losses);
int emg_set_threads(emg_session *s, int n_threads);
"""
OLD_CDEFS = {1: V1_CDEF, 2: V2_CDEF}


def abi_version(path: str) -> int:
    ffi = cffi.FFI()
    ffi.cdef("int emg_abi_version(void);")
    return int(ffi.dlopen(path).emg_abi_version())


class OldSession:
    """A session of an ABI version 1 library (one layer, vocabulary 27, rows of 16 tokens) or version 2 one
    (uint8 lengths)."""

    _ffis: ClassVar[dict[int, Any]] = {}

    def __init__(self, path: str, shape: ModelShape, max_batch: int, version: int) -> None:
        if version not in OldSession._ffis:
            OldSession._ffis[version] = cffi.FFI()
            OldSession._ffis[version].cdef(OLD_CDEFS[version])
        self.ffi, self.version = OldSession._ffis[version], version
        self.lib = self.ffi.dlopen(path)
        out = self.ffi.new("emg_session **")
        if version == 1:
            status = self.lib.emg_create(shape.d_model, shape.n_heads, max_batch, out)
        else:
            fields = ("d_model", "n_heads", "n_layers", "vocab", "context")
            status = self.lib.emg_create(self.ffi.new("emg_shape *", {f: getattr(shape, f) for f in fields}),
                                         max_batch, out)
        if status != 0:
            raise RuntimeError(f"{path}: emg_create failed with status {status}")
        self.s = out[0]

    def _p(self, ctype: str, a: np.ndarray) -> Any:
        return self.ffi.cast(ctype, self.ffi.from_buffer(a))

    def set_state(self, state: TrainState) -> None:
        assert self.lib.emg_set_state(self.s, self._p("float *", state.params), self._p("float *", state.adam_m),
                                      self._p("float *", state.adam_v), state.step) == 0

    def set_threads(self, n: int) -> None:
        assert self.lib.emg_set_threads(self.s, n) == 0

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        if self.version == 1:
            tokens = np.ascontiguousarray(tokens[..., :V1_SEQ])
        lengths = lengths.astype(np.uint8)  # within the old bounds: contexts of at most 64
        losses = np.empty(len(lrs), np.float32)
        status = self.lib.emg_train_steps(self.s, len(lrs), tokens.shape[1], self._p("uint8_t *", tokens),
                                          self._p("uint8_t *", lengths), self._p("float *", lrs),
                                          self._p("float *", losses))
        if status != 0:
            raise RuntimeError(f"emg_train_steps failed with status {status}")
        return losses

    def close(self) -> None:
        self.lib.emg_destroy(self.s)


def open_library(path: str, shape: ModelShape, batch: int) -> Any:
    version = abi_version(path)
    return OldSession(path, shape, batch, version) if version in OLD_CDEFS else NativeSession(path, shape, batch)


def run_cell(libs: list[str], shape: ModelShape, batch: int, data: Dataset, rounds: int, target_s: float,
             threads: int, clock, v1_rows: bool) -> list[tuple[list[float], float]]:
    """Per library: its us/step per round, and the mean analytic FLOPs per step."""
    sessions = [open_library(lib, shape, batch) for lib in libs]
    for s in sessions:
        s.set_state(TrainState.fresh(init_params(shape, 0)))
        if threads > 1:
            s.set_threads(threads)
    sampler = BatchSampler(data, batch, 0, stream=BENCH_STREAM)

    def sample(k: int) -> tuple[np.ndarray, np.ndarray]:
        tokens, lengths = sampler.sample(k)
        if v1_rows:  # the rows version 1 takes: at most 16 tokens, the same live positions for every library
            lengths = np.minimum(lengths, V1_SEQ).astype(lengths.dtype)
        return tokens, lengths

    warm_tokens, warm_lengths = sample(4)
    lrs = lr_schedule(1, 4, 10**6, 1e-3)
    t0 = time.perf_counter()
    for s in sessions:
        s.train_steps(warm_tokens, warm_lengths, lrs)
    per_step = (time.perf_counter() - t0) / (4 * len(sessions))
    k = max(1, int(target_s / per_step))
    times: list[list[float]] = [[] for _ in libs]
    flops = []
    for r in range(rounds):
        tokens, lengths = sample(k)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("libs", nargs="+", help="shared libraries; ratios are against the first")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[16])
    parser.add_argument("--n-layers", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=NAMES_VOCAB, help="other than 27: synthetic names")
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--target-s", type=float, default=0.05, help="seconds per library per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--peak", type=float, default=None, help="FP32 GFLOP/s for the %% of peak column")
    parser.add_argument("--names", default=os.environ.get("EEMICROGPT_DATA", "../shared/data/names.txt"))
    parser.add_argument("--shape", nargs="+", default=None,
                        help="recipe, full or d_model,heads,layers,vocab,context,batch on full-length windows "
                             "(instead of --sizes and --batches)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that proves the script works (d16, batch 4, 2 short rounds); its timings "
                             "mean nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.batches, args.rounds, args.target_s = [16], [4], 2, 0.001
    v1_rows = any(abi_version(lib) == 1 for lib in args.libs)
    if v1_rows and (args.shape or (args.n_layers, args.vocab, args.context) != (1, NAMES_VOCAB, DEFAULT_CONTEXT)):
        parser.error("an ABI version 1 library runs one layer, vocabulary 27 and context 16 only")
    try:
        cells = [parse_shape(spec) for spec in args.shape or ()]
    except ValueError as e:
        parser.error(str(e))
    print(f"clock: {args.clock}; load average before: {os.getloadavg()[0]:.2f}")
    windows = bool(cells)
    if not windows:
        form = Form(args.n_layers, args.vocab, args.context)
        if form.uses_names:
            data = encode(read_names(args.names).names, Vocabulary.names(), args.context)[0]
        else:
            data = synthetic_data(form)
        print(f"shape: {form.shape(args.sizes[0]).describe()}" + (" (rows cut to 16 tokens: an ABI 1 library)"
                                                                   if v1_rows else ""))
        cells = [(f"d{d:<3} b{batch:<4}", form.shape(d), batch) for d in args.sizes for batch in args.batches]
    print("cell | " + " | ".join(f"{Path(lib).parent.name}/{Path(lib).stem}" for lib in args.libs))
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for label, shape, batch in cells:
        if windows:
            data = full_windows(shape)
            print(f"{label}: {shape.describe()}, batch {batch}, full-length windows")
        results = run_cell(args.libs, shape, batch, data, args.rounds, args.target_s, args.threads, clock, v1_rows)
        base = results[0][0]
        out = []
        for times, flops in results:
            us = statistics.median(times)
            ratio = statistics.median(b / t for b, t in zip(base, times, strict=True))
            pct = f" {100 * flops / (us * 1e3) / args.peak:.1f}%" if args.peak else ""
            out.append(f"{us:8.1f} us ({us / batch:6.2f}/sample){pct} x{ratio:.3f}")
        print(f"{label} | " + " | ".join(out), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
