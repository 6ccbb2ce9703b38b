"""Benchmarks: us/step per backend and size, batch scaling, and the seed's loss-within-a-time-budget table.

FLOPs per step are counted analytically from the shape and the live positions of the measured batches
(sequence b of length L_b has P_b = L_b - 1 live positions; position t attends to t + 1 keys; L layers,
V tokens):
    forward  = sum_b P_b * (L * 24 d^2 + 2 V d) + L * 4 d * sum_b P_b (P_b + 1) / 2
        24 d^2 = Q, K, V, O projections (4 x 2 d^2) + FFN (2 x 2 x 4 d^2); 2 V d = LM head (54 d at V = 27);
        4 d per (query, key) pair = scores (2 d) + weighted sum of values (2 d), summed over heads
    backward = 2 x forward (input gradients and weight gradients of every matmul)
    Adam     = 12 x n_params (nominal elementwise count)
    FLOPs/step = 3 x forward + 12 x n_params
Norms, softmax, ReLU and embeddings are not counted. The count is dense: a backend that skips zero work
(the sparse LM-head backward) does fewer real operations than credited. At d_model 16 / 128 with ~104 live
positions this gives ~2.3M / ~127M FLOPs, the seed's figures.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.backend import TrainState
from ..backends.precision import FP32
from ..backends.registry import BackendEntry, BackendRegistry, open_session
from ..base.abi import LENGTH_DTYPE
from ..base.errors import BackendSelectionError
from ..data.names import BatchSampler, Dataset
from ..model.optim import lr_schedule
from ..model.shape import DEFAULT_CONTEXT, NAMES_VOCAB, ModelShape, default_heads, init_params
from ..training.config import PRESETS, TrainConfig, preset
from ..training.trainer import PreparedData, train

SIZES = tuple(PRESETS)  # 16, 32, 64, 128
# d_model, heads, layers, vocabulary, context, batch: nanoGPT's CPU recipe for shakespeare_char (the shipped config
# shakespeare_char_cpu) and its full shakespeare_char model. `--shape` in `eemicrogpt bench` and torch_compare.py.
NAMED_SHAPES = {"recipe": (128, 4, 4, 65, 64, 12), "full": (384, 6, 6, 65, 256, 64)}
SCALING_BATCHES = (1, 16, 64, 256)
ADAM_FLOPS_PER_PARAM = 12
BENCH_STREAM = 4  # batch stream of the benchmark: independent of the training streams


def step_flops(shape: ModelShape, lengths: np.ndarray) -> np.ndarray:
    """Analytic FLOPs of each step for lengths [n, B] (see the module docstring)."""
    d, layers = shape.d_model, shape.n_layers
    live = lengths.astype(np.float64) - 1.0
    positions = live.sum(axis=-1)
    pairs = (live * (live + 1.0) / 2.0).sum(axis=-1)
    forward = positions * (layers * 24 * d * d + 2 * shape.vocab * d) + layers * 4 * d * pairs
    return 3.0 * forward + ADAM_FLOPS_PER_PARAM * shape.n_params


@dataclass(frozen=True)
class Form:
    """Everything of a benchmarked shape except its width: layers, vocabulary and context (the names' by
    default; other vocabularies and contexts run on synthetic_data)."""

    n_layers: int = 1
    vocab: int = NAMES_VOCAB
    context: int = DEFAULT_CONTEXT

    def shape(self, d_model: int) -> ModelShape:
        return ModelShape(d_model, heads_for(d_model), self.n_layers, self.vocab, self.context)

    @property
    def uses_names(self) -> bool:
        return self.vocab == NAMES_VOCAB and self.context == DEFAULT_CONTEXT


def synthetic_data(form: Form, n: int = 4096, seed: int = 0) -> Dataset:
    """n names of random symbols with lengths uniform in 1..context (every row is filled to its length; the
    live positions then average about context / 2 + 1), for vocabularies and contexts the names file lacks."""
    rng = np.random.default_rng([seed, BENCH_STREAM])
    shape = form.shape(16)
    tokens = np.zeros((n, shape.seq_len), np.uint8)
    lengths = np.empty(n, LENGTH_DTYPE)
    for i in range(n):
        chars = int(rng.integers(1, form.context + 1))
        row = [shape.boundary, *rng.integers(0, shape.boundary, chars).tolist(), shape.boundary][: shape.seq_len]
        tokens[i, : len(row)] = row
        lengths[i] = len(row)
    return Dataset(tokens, lengths)


def parse_shape(spec: str) -> tuple[str, ModelShape, int]:
    """`recipe`, `full` or d_model,heads,layers,vocab,context,batch as (label, shape, batch); ValueError with a
    one-line reason."""
    try:
        dims = NAMED_SHAPES.get(spec) or tuple(int(x) for x in spec.split(","))
        d, heads, layers, vocab, context, batch = dims
    except ValueError:
        raise ValueError(f"shape {spec!r}: expected {' or '.join(NAMED_SHAPES)} or "
                         "d_model,heads,layers,vocab,context,batch (six integers)") from None
    try:
        shape = ModelShape(d, heads, n_layers=layers, vocab=vocab, context=context)
    except ValueError as e:
        raise ValueError(f"shape {spec!r}: {e}") from None
    if batch < 1:
        raise ValueError(f"shape {spec!r}: batch must be >= 1, got {batch}")
    label = spec if spec in NAMED_SHAPES else f"d{d}h{heads}L{layers}V{vocab}C{context}"
    return label, shape, batch


def full_windows(shape: ModelShape, n: int = 1024, seed: int = 0) -> Dataset:
    """n random token windows of the whole sequence length (context + 1 tokens, every position live), as text
    training feeds a step."""
    rng = np.random.default_rng([seed, BENCH_STREAM])
    tokens = rng.integers(0, shape.vocab, (n, shape.seq_len), dtype=np.uint8)
    return Dataset(tokens, np.full(n, shape.seq_len, LENGTH_DTYPE))


@dataclass
class BenchRow:
    backend: str
    d_model: int
    n_heads: int
    batch: int
    us_per_step: float
    us_per_sample: float
    steps_per_s: float
    gflops: float
    pct_peak: float | None
    live_positions: float  # mean live positions per measured step
    steps_timed: int
    repeats: int
    threads: int = 1  # threads per step the session used
    precision: str = FP32  # the backend's BackendSpec.precision
    error: str | None = None  # the backend failed on this cell; the numbers are NaN
    n_layers: int = 1
    vocab: int = NAMES_VOCAB
    context: int = DEFAULT_CONTEXT

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.d_model, self.n_heads, self.n_layers, self.vocab, self.context)

    @property
    def us_per_live_position(self) -> float:
        return self.us_per_step / self.live_positions if self.live_positions else float("nan")


def failed_row(backend: str, shape: ModelShape, batch: int, error: str) -> BenchRow:
    nan = float("nan")
    return BenchRow(backend, shape.d_model, shape.n_heads, batch, nan, nan, nan, nan, None, nan, 0, 0, error=error,
                    n_layers=shape.n_layers, vocab=shape.vocab, context=shape.context)


def heads_for(d_model: int) -> int:
    """The model's head count for this width (model.default_heads: 8 at d128, as the seed)."""
    return default_heads(d_model)


def time_steps(
    entry: BackendEntry,
    shape: ModelShape,
    batch: int,
    data: Dataset,
    *,
    repeats: int = 5,
    target_s: float = 0.3,
    peaks: dict[str, float] | None = None,
    seed: int = 0,
    threads: int | None = None,
) -> BenchRow:
    """Median us/step over `repeats` timed chunks after a warm-up; real batches from the sampler."""
    sampler = BatchSampler(data, batch, seed, stream=BENCH_STREAM)
    with open_session(entry, shape, batch, threads=threads) as session:
        threads_used = session.threads
        session.set_state(TrainState.fresh(init_params(shape, seed)))
        step = 0

        def run(n: int) -> tuple[float, np.ndarray]:
            nonlocal step
            tokens, lengths = sampler.sample(n)
            lrs = lr_schedule(step + 1, n, 10**6, 1e-3)  # small LR: the weights stay sane for any length
            t0 = time.perf_counter()
            session.train_steps(tokens, lengths, lrs)
            step += n
            return time.perf_counter() - t0, lengths

        run(2)  # cold caches, lazy set-up
        n, spent = 2, 0.0
        while spent < 0.05 * target_s and n < 4096:  # warm-up doubles as the per-step estimate
            spent, _ = run(n)
            n *= 2
        per_step = spent / (n // 2)
        k = max(1, int(target_s / repeats / per_step))
        times, lengths_seen = [], []
        for _ in range(repeats):
            dt, lengths = run(k)
            times.append(dt / k)
            lengths_seen.append(lengths)
    lengths_all = np.concatenate(lengths_seen)
    us = 1e6 * statistics.median(times)
    gflops = float(step_flops(shape, lengths_all).mean()) / (us * 1e3)
    peak = (peaks or {}).get(precision_of(entry))  # the peak of what this backend computes in
    return BenchRow(
        backend=entry.name,
        d_model=shape.d_model,
        n_heads=shape.n_heads,
        batch=batch,
        us_per_step=us,
        us_per_sample=us / batch,
        steps_per_s=1e6 / us,
        gflops=gflops,
        pct_peak=100.0 * gflops / (peak * threads_used) if peak else None,  # peak is one core's: scale by threads
        live_positions=float((lengths_all.astype(np.float64) - 1).sum(axis=-1).mean()),
        steps_timed=k * repeats,
        repeats=repeats,
        threads=threads_used,
        precision=precision_of(entry),
        n_layers=shape.n_layers,
        vocab=shape.vocab,
        context=shape.context,
    )


def precision_of(entry: BackendEntry) -> str:
    """The compute precision a backend declares (BackendSpec.precision)."""
    return entry.spec.precision if entry.spec else FP32


def pick_backends(
    registry: BackendRegistry, requested: str | None, precision: str | None = None
) -> list[BackendEntry]:
    """Every available backend (of `precision`, when given), or the one asked for (an unavailable request, or
    one of another precision, is an error, as in train)."""
    if requested and requested != "auto":
        entry = registry.get(requested)
        if entry is None or not entry.available or (precision and entry.spec and entry.spec.precision != precision):
            registry.select(requested, ModelShape(32), 16, precision=precision)  # raises the standard error
        assert entry is not None
        return [entry]
    entries = [e for e in registry.available() if precision is None or precision_of(e) == precision]
    if not entries and precision is not None:  # say why each backend of that precision cannot run, not a shape
        why = "; ".join(e.status_reason for e in registry.entries if e.spec and e.spec.precision == precision)
        raise BackendSelectionError(f"no available backend computes in {precision} here"
                                    + (f" ({why})" if why else " (none is installed)"))
    if not entries:
        registry.select(None, ModelShape(32), 16)  # raises: says what to install
    return entries


Cell = tuple[BackendEntry, ModelShape, int, int | None]  # (backend, shape, batch, threads: None = the default)


def measure(
    cells: Iterable[Cell],
    data: Dataset,
    *,
    peaks: dict[str, float] | None = None,
    repeats: int = 5,
    target_s: float = 0.3,
) -> tuple[list[BenchRow], list[str]]:
    """Time each (backend, shape, batch, threads) cell that the backend supports; a note for each it does not.

    A backend that raises gets a row holding its error, and the other cells still run. A backend that cannot
    split a step runs every thread request on one thread: its repeats are measured once.
    """
    rows, notes = [], []
    skipped: set[tuple[str, ModelShape, int]] = set()
    one_thread: set[str] = set()  # backends seen running a request for more threads on one
    done: set[tuple[str, ModelShape, int, int]] = set()
    for entry, shape, batch, threads in cells:
        reason = entry.spec.unsupported_reason(shape, batch) if entry.spec else "no spec"
        if reason:
            if (entry.name, shape, batch) not in skipped:
                notes.append(f"{entry.name} d{shape.d_model} batch {batch}: skipped ({reason})")
                skipped.add((entry.name, shape, batch))
            continue
        if entry.name in one_thread and (entry.name, shape, batch, 1) in done:
            continue  # the same one-thread cell again
        try:
            row = time_steps(entry, shape, batch, data, repeats=repeats, target_s=target_s, peaks=peaks,
                             threads=threads)
        except Exception as exc:
            rows.append(failed_row(entry.name, shape, batch, f"{type(exc).__name__}: {exc}"))
            continue
        if threads != 1 and row.threads == 1:
            one_thread.add(entry.name)
        if (entry.name, shape, batch, row.threads) not in done:
            rows.append(row)
            done.add((entry.name, shape, batch, row.threads))
    return rows, notes


def require_measured(rows: list[BenchRow], notes: list[str]) -> None:
    """A benchmark that timed no cell (each skipped as unsupported) is an error, not an empty table."""
    if not rows:
        raise BackendSelectionError(f"nothing was measured: {'; '.join(notes) or 'no cell to time'}")


def speed_cells(
    entries: Iterable[BackendEntry], shapes: Iterable[ModelShape], batches: Iterable[int] = (16,),
    threads: Sequence[int | None] = (None,),
) -> list[Cell]:
    """Every backend at every shape, batch and thread count: the main table. A backend's thread counts run
    back to back, so their ratio is measured side by side."""
    return [(entry, shape, b, t) for entry in entries for shape in shapes for b in batches for t in threads]


def scaling_cells(
    entry: BackendEntry, shapes: Iterable[ModelShape], batches: Iterable[int] = SCALING_BATCHES,
    threads: Sequence[int | None] = (None,),
) -> list[Cell]:
    """One backend at every shape, batch and thread count: the batch-scaling table."""
    return [(entry, shape, b, t) for shape in shapes for b in batches for t in threads]


def best_backend(
    registry: BackendRegistry, requested: str | None, sizes: Iterable[int], precision: str | None = None
) -> BackendEntry:
    """The requested backend, else what `auto` picks (of `precision`, default fp32) for the first size at batch 16."""
    first = next(iter(sizes))
    if requested and requested != "auto":
        return pick_backends(registry, requested, precision)[0]
    entry = registry.auto_choice(ModelShape(first, heads_for(first)), 16, precision=precision)
    if entry is None:
        raise BackendSelectionError("no available backend for the benchmark; see `eemicrogpt backends`")
    return entry


@dataclass
class LossRow:
    backend: str
    d_model: int
    n_heads: int
    lr: float
    seconds: float  # the budget
    steps: int  # steps that fit (estimated from a timed warm-up)
    us_per_step: float
    train_loss: float  # mean of the last 100 training losses
    val_loss: float | None
    error: str | None = None  # training failed at this size; the numbers are NaN


def loss_at(
    registry: BackendRegistry, entry: BackendEntry, sizes: Iterable[int], data: PreparedData, data_path: str,
    seconds: float, threads: int | None = None,
) -> list[LossRow]:
    """The seed's bpc@1s: train each size from scratch within `seconds`, LR schedule spanning those steps."""
    rows = []
    for d in sizes:
        base = preset(d) if d in PRESETS else TrainConfig(d_model=d)
        cfg = dataclasses.replace(
            base, backend=entry.selector, data=data_path, time_budget=seconds, log_every=10**9, out=None,
            threads=threads,
        )
        try:
            result = train(cfg, registry, data=data)
        except Exception as exc:  # the other sizes still run; the row says what happened
            nan = float("nan")
            rows.append(LossRow(entry.name, d, cfg.n_heads, cfg.lr, seconds, 0, nan, nan, None,
                                f"{type(exc).__name__}: {exc}"))
            continue
        rows.append(LossRow(entry.name, d, cfg.n_heads, cfg.lr, seconds, result.total_steps,
                            result.us_per_step, result.train_loss, result.val_loss))
    return rows


def _plain(row: Any) -> Any:
    """A dataclass row as a dict; NaN (a failed cell's numbers) as null, which JSON can hold."""
    if not dataclasses.is_dataclass(row) or isinstance(row, type):
        return row
    return {k: None if isinstance(v, float) and v != v else v for k, v in dataclasses.asdict(row).items()}


def as_json(**sections: Any) -> dict[str, Any]:
    """Dataclass rows to plain dicts, for `--json`."""
    out: dict[str, Any] = {}
    for key, value in sections.items():
        if isinstance(value, list):
            out[key] = [_plain(v) for v in value]
        else:
            out[key] = value
    return out
