"""The backend conformance kit: a pytest base class every backend package subclasses in a few lines.

    from eemicrogpt_core.kit.conformance import BackendConformance

    class TestAvx512Conformance(BackendConformance):
        backend_name = "avx512"
        d_models = (16, 32, 64, 128)
        skip = {"no fp64 path": ["test_something"]}   # declared exemptions, reported as skips

The backend is obtained through the registry exactly as users get it (`load_registry`, `open_session`, the
validated session) and checked against numpy_ref (package eemicrogpt-backend-numpy, required) on seeded
batches of real names (`names_file()`: found as the program finds it, else a one-line failure). Every size,
step count and tolerance is a class attribute so that slow environments (QEMU emulation) can shrink the work
(`training_d_models` keeps the multi-step checks to some of the widths).

The checks, per d_model in `d_models` (n_heads from `heads_for`; one layer, the names' 27 tokens, context 16):
  loss and per-tensor gradients vs numpy_ref float64 (RMS and max relative error, printed); one Adam step
  from a state with Adam history (params, m, v, step); a `trajectory_steps` training run vs numpy_ref
  float64, checked in short windows restarted from the reference's own states plus a statistic of the
  whole run (see test_loss_trajectory_matches_reference); set_state/get_state round trip (exact, copies);
  determinism (bit-identical reruns); loss_and_grads leaves the state alone. Per case of `optimizer_cases`
  (a clip that engages, a large weight decay, other betas and eps; DEFAULT_OPTIMIZER_CASES): one update and the
  trajectory's windows and quarter means against spec_training (float64 reference gradients and
  optim.adam_update with those settings), each case shown to move the spec well beyond the bound first; skipped
  for a backend whose sessions have no set_optimizer.
Per shape of `shape_matrix` (other vocabularies, contexts, depths and widths, on synthetic names of that
vocabulary whose lengths reach past the context): loss and gradients vs numpy_ref float64, a short training
window vs float64, and bit-identical reruns.
Once per class: every entry of BAD_INPUTS is rejected with a BatchError by the validated session, state
untouched.
The session contract (docs/writing-a-backend.md), per d_model: calls of 1, 2 and 3 steps end in the same
state as one call of 6 (every call applies all its updates, the last included: the trainer calls in chunks);
what sessions return has the declared types, shapes and dtypes (state in `state_dtype`, losses float32) and
is finite; an update that overflows the parameters makes the call raise rather than return non-finite state.

A backend that is not installed is a failure, never a skip: the kit is run to test that backend. An
installed backend this machine cannot run (its probe says why) is skipped with the probe's reason, unless
EEMICROGPT_REQUIRE_BACKENDS (a comma list of names, or `all`) names it: then that reason is a failure too.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ..backends.backend import STATE_ARRAYS, TrainState
from ..backends.registry import BackendEntry, BackendRegistry, load_registry, open_session
from ..backends.validate import ValidatedSession
from ..base.abi import LENGTH_DTYPE
from ..base.errors import BackendSelectionError, BatchError, NonFiniteError
from ..data.datafile import find_names_file
from ..model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, adam_update, lr_schedule
from ..model.reference import StepModel, prepare_batch
from ..model.shape import DEFAULT_CONTEXT, NAMES_VOCAB, ModelShape, init_params, views

REFERENCE = "numpy_ref"
SEED_SEQ = DEFAULT_CONTEXT + 1  # tokens per row at the kit's per-d_model shape
BOUNDARY = NAMES_VOCAB - 1
REQUIRE_ENV = "EEMICROGPT_REQUIRE_BACKENDS"

# numpy_ref results keyed by everything they depend on; the same inputs recur across test classes.
_REFERENCE_CACHE: dict[tuple[object, ...], Any] = {}


# ---- inputs ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Names:
    names: tuple[str, ...]


def names_file() -> Path:
    """The names file the kit and the project's tests read, found the way the program finds it.

    $EEMICROGPT_DATA, the shared copy beside a checkout (../shared/data/names.txt), the verified download
    cache. None there is a one-line test failure that says how to provide it: the checks' bounds assume
    real names, so there is no synthetic stand-in.
    """
    beside_checkout = Path(__file__).resolve().parents[2] / "shared" / "data" / "names.txt"
    path, hint = find_names_file(extra=[beside_checkout, Path("../shared/data/names.txt").resolve()])
    if path is None:
        pytest.fail(hint, pytrace=False)
    if not path.is_file():
        pytest.fail(f"the names file {path} ({hint}) does not exist", pytrace=False)
    return path


@functools.cache
def load_names(path: str | None = None) -> Names:
    """Lower-case a-z names from `path`, or from names_file()."""
    source = Path(path) if path else names_file()
    lines = source.read_text(encoding="utf-8").split()
    names = tuple(n for n in (line.lower() for line in lines) if n.isascii() and n.isalpha())
    if not names:
        pytest.fail(f"the names file {source} holds no a-z names", pytrace=False)
    return Names(names)


def make_batches(
    names: tuple[str, ...], n: int, batch: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """n seeded batches of a-z names: tokens uint8 [n, batch, 17], lengths uint16 [n, batch] (context 16).

    Padding holds seeded random tokens (any value < vocab is legal there) so that a backend reading
    padding shows up as a mismatch against the reference.
    """
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, NAMES_VOCAB, size=(n, batch, SEED_SEQ), dtype=np.uint8)
    lengths = np.empty((n, batch), LENGTH_DTYPE)
    for i, j in np.ndindex(n, batch):
        name = names[rng.integers(len(names))]
        seq = [BOUNDARY, *(ord(ch) - ord("a") for ch in name), BOUNDARY][:SEED_SEQ]
        tokens[i, j, : len(seq)] = seq
        lengths[i, j] = len(seq)
    return tokens, lengths


def edge_batch(names: tuple[str, ...], batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch [batch, 17] that includes the extreme lengths 2 (empty name) and 17 (a full context)."""
    tokens, lengths = make_batches(names, 1, batch, seed)
    tokens, lengths = tokens[0], lengths[0]
    tokens[0, :2], lengths[0] = BOUNDARY, 2
    if batch > 1:
        tokens[1] = np.random.default_rng(seed).integers(0, BOUNDARY, SEED_SEQ, dtype=np.uint8)
        tokens[1, 0], lengths[1] = BOUNDARY, SEED_SEQ
    return tokens, lengths


def synthetic_batches(shape: ModelShape, n: int, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n seeded batches for any shape: random symbols (0..vocab-2) between boundaries, name lengths from 0 to
    past the context (so rows are truncated at context + 1 tokens), random padding. Each batch holds the
    extreme lengths 2 and context + 1 when it has room."""
    rng = np.random.default_rng(seed)
    seq, b = shape.seq_len, shape.boundary
    tokens = rng.integers(0, shape.vocab, size=(n, batch, seq), dtype=np.uint8)
    lengths = np.empty((n, batch), LENGTH_DTYPE)
    for i, j in np.ndindex(n, batch):
        n_chars = {0: 0, 1: shape.context + 3}.get(j, int(rng.integers(0, shape.context + 3)))
        row = [b, *rng.integers(0, b, size=n_chars).tolist(), b][:seq]
        tokens[i, j, : len(row)] = row
        lengths[i, j] = len(row)
    return tokens, lengths


# ---- comparisons -----------------------------------------------------------------------------------------
def relative_errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(RMS relative error, max relative error), both relative to the size of `want`.

    The max error is divided by max|want| rather than taken element by element, where near-zero entries
    would make any rounding look huge. An all-zero `want` demands an all-zero `got`.
    """
    diff = got.astype(np.float64) - want.astype(np.float64)
    scale_rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
    scale_max = float(np.max(np.abs(want)))
    if scale_max == 0.0:
        worst = float(np.max(np.abs(diff)))
        return (0.0, 0.0) if worst == 0.0 else (np.inf, np.inf)
    return float(np.sqrt(np.mean(diff**2))) / scale_rms, float(np.max(np.abs(diff))) / scale_max


def per_tensor_errors(shape: ModelShape, got: np.ndarray, want: np.ndarray) -> dict[str, tuple[float, float]]:
    got_views, want_views = views(shape, got), views(shape, want)
    return {name: relative_errors(got_views[name], want_views[name]) for name in shape.tensor_names}


@dataclass(frozen=True)
class Tolerances:
    loss_rel: float  # |loss - reference| / reference (reference computed in float64)
    grad_rel_rms: float  # per tensor RMS relative error vs float64 gradients
    grad_rel_max: float  # per tensor max |error| / max |reference|
    adam_param: float  # max |params - reference| / lr after one Adam step
    adam_moment: float  # per moment buffer max |error| / max |reference| after one Adam step
    trajectory_window: float  # max |loss difference| per step inside a window restarted from reference states
    trajectory_window_params: float  # relative RMS error of the parameter change over a window
    trajectory: float  # max |difference| of the whole run's quarter means of the loss


# Starting points per compute precision; a backend sets its own with class attributes. The trajectory
# bounds (last three) are derived in docs/testing-trajectories.md from fp32 runs measured against float64.
DEFAULT_TOLERANCES: dict[str, Tolerances] = {
    "fp64": Tolerances(1e-12, 1e-10, 1e-9, 1e-9, 1e-10, 1e-9, 1e-9, 1e-9),
    "fp32": Tolerances(1e-5, 1e-5, 1e-4, 1e-3, 1e-4, 5e-4, 1e-3, 1e-2),
    "fp16": Tolerances(3e-3, 3e-2, 1e-1, 2e-1, 5e-2, 2e-2, 1e-1, 1e-1),
}


# The shape matrix: every vocabulary bound and size in between, contexts short, odd and full, 1-4 layers and
# widths including non-powers of two (48, 80). (d_model, n_heads, n_layers, vocab, context).
DEFAULT_SHAPE_MATRIX: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 4, 1, 2, 8),
    (48, 4, 2, 64, 33),
    (80, 4, 4, 27, 16),
    (64, 4, 2, 256, 64),
    (128, 8, 1, 64, 33),
    (32, 8, 4, 256, 8),
)


def matrix_id(dims: tuple[int, int, int, int, int]) -> str:
    d, h, layers, vocab, context = dims
    return f"d{d}h{h}L{layers}V{vocab}C{context}"


# The optimiser settings the kit trains with besides the defaults (each case sets one aspect, the rest at their
# defaults). Measured on the kit's runs (float64, 200 steps from init at trajectory_lrs): the gradient's global
# L2 norm stays within 0.60-1.35 at d16 and 2.2-5.8 at d128, so a clip of 0.1 engages at every step (the check
# asserts it); a decay of 2 shrinks the parameters by about a tenth per 0.05 of summed lr (every tensor is
# decayed); betas 0.9/0.95 and an eps of 1e-4 (near the gradient's per-element size) change the moments and the
# denominator.
DEFAULT_OPTIMIZER_CASES: dict[str, OptimizerSettings] = {
    "clip": OptimizerSettings(grad_clip=0.1),
    "decay": OptimizerSettings(weight_decay=2.0),
    "moments": OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-4),
}
# The per-width checks that train many steps: what BackendConformance.training_d_models narrows.
TRAINING_CHECKS = frozenset({
    "test_loss_trajectory_matches_reference",
    "test_optimizer_training_follows_reference",
    "test_determinism",
    "test_chunked_calls_match_one_call",
})
# Each case must move the reference's trajectory windows by this many times the bound they are judged with (the same
# steps with the default optimiser, from the same state), so a backend that ignored the setting would fail there.
# (One update moves a parameter by lr at most, so the one-step check asks less: see its test.)
OPTIMIZER_POWER = 2.0


def spec_training(shape: ModelShape, state: TrainState, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray,
                  opt: OptimizerSettings) -> tuple[np.ndarray, TrainState, np.ndarray]:
    """The specification of training with `opt` in float64, no backend involved: model/reference.py's gradients
    and optim.adam_update, one step per lr. Returns the losses, the end state and each step's gradient norm
    (before clipping)."""
    params, m, v = (np.array(a, np.float64) for a in (state.params, state.adam_m, state.adam_v))
    model = StepModel(shape, params)
    losses, norms = np.empty(len(lrs)), np.empty(len(lrs))
    for i, lr in enumerate(lrs):
        losses[i] = model.loss_and_grads(prepare_batch(tokens[i], lengths[i]))
        norms[i] = float(np.sqrt(np.dot(model.grads, model.grads)))
        adam_update(params, model.grads, m, v, int(state.step) + i + 1, float(lr), opt)
    return losses, TrainState(params, m, v, int(state.step) + len(lrs)), norms


@dataclass(frozen=True)
class OptimizerReference:
    """The specification's run of trajectory_inputs with one optimiser case."""

    losses: np.ndarray
    states: dict[int, TrainState]  # at every window edge
    norms: np.ndarray  # each step's gradient norm before clipping
    power: float  # largest relative RMS difference of a window's parameter change (with Adam history) from the
    # same window trained with the default optimiser from the same state


# ---- registry access -------------------------------------------------------------------------------------
@functools.cache
def _registry(extra_plugins: tuple[object, ...] = ()) -> BackendRegistry:
    return load_registry(extra_plugins=extra_plugins)


def _required(name: str) -> bool:
    wanted = {w.strip() for w in os.environ.get(REQUIRE_ENV, "").split(",") if w.strip()}
    return "all" in wanted or name in wanted


def _unusable(name: str, reason: str) -> None:
    """Skip, or fail when EEMICROGPT_REQUIRE_BACKENDS names the backend."""
    if _required(name):
        pytest.fail(f"{name} is required by {REQUIRE_ENV} but unusable: {reason}", pytrace=False)
    pytest.skip(reason if reason.startswith(f"{name}:") else f"{name}: {reason}")


def _entry(name: str, extra_plugins: tuple[object, ...]) -> BackendEntry:
    registry = _registry(extra_plugins)
    try:
        entry = registry.get(name)
    except BackendSelectionError as exc:  # two distributions provide the name: say which to test
        pytest.fail(f"{exc}; set backend_name to the qualified name", pytrace=False)
    if entry is None:
        failures = [f for f in registry.failures if f.plugin == name]
        reason = failures[0].error if failures else "no installed plugin registers it"
        pytest.fail(
            f"{name} is not installed ({reason}): install its package (e.g. `pip install -e <its directory>`) "
            "before running its conformance tests", pytrace=False,
        )
    if not entry.available:
        _unusable(name, entry.status_reason)
    return entry


def _reference_entry(extra_plugins: tuple[object, ...]) -> BackendEntry:
    entry = _registry(extra_plugins).get(REFERENCE)
    if entry is None or not entry.available:
        why = "not installed" if entry is None else entry.status_reason
        pytest.fail(
            f"the conformance kit compares against {REFERENCE} ({why}): "
            "pip install eemicrogpt-backend-numpy (or -e backends/numpy_ref)",
            pytrace=False,
        )
    return entry


@contextmanager
def _session(entry: BackendEntry, shape: ModelShape, max_batch: int, dtype: str) -> Iterator[ValidatedSession]:
    session = open_session(entry, shape, max_batch, dtype)
    try:
        yield session
    finally:
        session.close()


def _state_of(params: np.ndarray, seed: int, step: int) -> TrainState:
    """Params plus seeded, plausible Adam moments (so one update is well conditioned in every element)."""
    rng = np.random.default_rng(seed)
    m = (rng.standard_normal(params.size) * 1e-2).astype(np.float32)
    v = (m.astype(np.float64) ** 2 + rng.uniform(1e-4, 2e-4, params.size)).astype(np.float32)
    return TrainState(params.astype(np.float32), m, v, step)


# ---- bad inputs: each corrupts one aspect of a valid 2-step input of batch 4 (the session's max_batch) ------
Call = Callable[[Any, np.ndarray, np.ndarray, np.ndarray], object]


def _put(array: np.ndarray, index: tuple[int, ...], value: float) -> np.ndarray:
    array[index] = value
    return array


def _one_more_row(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, a[:, :1]], axis=1)


BAD_INPUTS: dict[str, Call] = {
    "token_equal_vocab": lambda s, t, ln, lr: s.train_steps(_put(t, (1, 2, 1), NAMES_VOCAB), ln, lr),
    "token_255_in_padding": lambda s, t, ln, lr: s.train_steps(
        _put(t, (0, 0, SEED_SEQ - 1), 255), _put(ln, (0, 0), 3), lr
    ),
    "length_0": lambda s, t, ln, lr: s.train_steps(t, _put(ln, (1, 0), 0), lr),
    "length_1": lambda s, t, ln, lr: s.train_steps(t, _put(ln, (0, 3), 1), lr),
    "length_over_context": lambda s, t, ln, lr: s.train_steps(t, _put(ln, (0, 1), SEED_SEQ + 1), lr),
    "tokens_int64": lambda s, t, ln, lr: s.train_steps(t.astype(np.int64), ln, lr),
    "tokens_float32": lambda s, t, ln, lr: s.train_steps(t.astype(np.float32), ln, lr),
    "lengths_int32": lambda s, t, ln, lr: s.train_steps(t, ln.astype(np.int32), lr),
    "tokens_short_rows": lambda s, t, ln, lr: s.train_steps(t[:, :, : SEED_SEQ - 1].copy(), ln, lr),
    "tokens_2d_for_steps": lambda s, t, ln, lr: s.train_steps(t[0], ln, lr),
    "lengths_wrong_batch": lambda s, t, ln, lr: s.train_steps(t, ln[:, :3].copy(), lr),
    "lrs_wrong_count": lambda s, t, ln, lr: s.train_steps(t, ln, lr[:1].copy()),
    "lr_nan": lambda s, t, ln, lr: s.train_steps(t, ln, _put(lr, (1,), np.nan)),
    "lr_inf": lambda s, t, ln, lr: s.train_steps(t, ln, _put(lr, (0,), np.inf)),
    "lr_negative": lambda s, t, ln, lr: s.train_steps(t, ln, _put(lr, (0,), -0.01)),
    "lrs_float64": lambda s, t, ln, lr: s.train_steps(t, ln, lr.astype(np.float64)),
    "batch_over_max": lambda s, t, ln, lr: s.train_steps(_one_more_row(t), _one_more_row(ln), lr),
    "grads_token_equal_vocab": lambda s, t, ln, lr: s.loss_and_grads(_put(t[0], (0, 1), NAMES_VOCAB), ln[0]),
    "grads_length_over_context": lambda s, t, ln, lr: s.loss_and_grads(t[0], _put(ln[0], (2,), SEED_SEQ + 1)),
    "grads_steps_shape": lambda s, t, ln, lr: s.loss_and_grads(t, ln),
}


# ---- the kit ---------------------------------------------------------------------------------------------
class BackendConformance:
    """Subclass as `Test<Something>` and set `backend_name`; override any attribute below as needed."""

    backend_name: ClassVar[str] = ""
    dtype: ClassVar[str] = "float32"  # the session dtype to open
    precision: ClassVar[str] = "fp32"  # compute precision: picks DEFAULT_TOLERANCES
    d_models: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    # The widths the multi-step checks train at (TRAINING_CHECKS: trajectories, determinism, chunked calls);
    # None means d_models. Under emulation a backend keeps its widest width to the single-step checks.
    training_d_models: ClassVar[tuple[int, ...] | None] = None
    batch: ClassVar[int] = 16
    seed: ClassVar[int] = 1234
    param_scale: ClassVar[float] = 1.5  # scales init params for the gradient checks: peakier softmaxes
    trajectory_steps: ClassVar[int] = 200
    # Training is chaotic: one ReLU input within rounding distance of 0 sends two correct fp32
    # implementations apart and Adam amplifies it, so where a run ends up depends on the last bits of a
    # BLAS (numpy_ref float32 vs float64 at d32 differ by 1.3e-2 at step 145 on one CPU and 1e-6 on
    # another). The per-step check therefore runs in short windows, each restarted from the float64
    # reference's own state, where two correct implementations agree to rounding; the whole run is judged
    # by a statistic (its quarter means). docs/testing-trajectories.md has the measurements.
    trajectory_lrs: ClassVar[dict[int, float]] = {16: 0.01, 32: 0.01, 64: 0.003, 128: 0.001}
    trajectory_windows: ClassVar[int] = 4  # spread evenly over the run, the first at step 0
    trajectory_window_steps: ClassVar[int] = 10
    adam_lr: ClassVar[float] = 0.01
    state_dtype: ClassVar[str] = "float32"  # the dtype of get_state()'s arrays (the checkpoint's)
    chunk_sizes: ClassVar[tuple[int, ...]] = (1, 2, 3)  # test_chunked_calls_match_one_call: the calls
    names_file: ClassVar[str | None] = None
    # In-process plugins registered next to the installed ones (for testing a backend before packaging).
    extra_plugins: ClassVar[tuple[object, ...]] = ()
    # Per-check tolerance overrides; None takes DEFAULT_TOLERANCES[precision].
    loss_rel_tol: ClassVar[float | None] = None
    grad_rel_rms_tol: ClassVar[float | None] = None
    grad_rel_max_tol: ClassVar[float | None] = None
    adam_param_tol: ClassVar[float | None] = None
    adam_moment_tol: ClassVar[float | None] = None
    trajectory_window_tol: ClassVar[float | None] = None
    trajectory_window_params_tol: ClassVar[float | None] = None
    trajectory_tol: ClassVar[float | None] = None
    skip: ClassVar[dict[str, list[str]]] = {}  # {reason: [test names]}
    # Shapes beyond the per-d_model checks (see DEFAULT_SHAPE_MATRIX); a backend narrows it to its envelope or
    # shrinks it under emulation, and a shape listed here that the backend does not support fails.
    shape_matrix: ClassVar[tuple[tuple[int, int, int, int, int], ...]] = DEFAULT_SHAPE_MATRIX
    matrix_batch: ClassVar[int] = 8
    matrix_window_steps: ClassVar[int] = 5
    matrix_lr: ClassVar[float] = 0.003
    # The optimiser checks' cases (DEFAULT_OPTIMIZER_CASES); a backend whose sessions have no set_optimizer skips them.
    optimizer_cases: ClassVar[dict[str, OptimizerSettings]] = DEFAULT_OPTIMIZER_CASES

    def heads_for(self, d_model: int) -> int:
        return 4

    def trajectory_lr(self, d_model: int) -> float:
        return self.trajectory_lrs.get(d_model, min(self.trajectory_lrs.values()))

    # -- plumbing --
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "d_model" in metafunc.fixturenames:
            widths = self.d_models
            if metafunc.function.__name__ in TRAINING_CHECKS and self.training_d_models is not None:
                unknown = set(self.training_d_models) - set(self.d_models)
                if unknown:
                    raise TypeError(f"{type(self).__name__}.training_d_models {sorted(unknown)} are not in d_models")
                widths = self.training_d_models
            metafunc.parametrize("d_model", widths, ids=[f"d{d}" for d in widths])
        if "optimizer_case" in metafunc.fixturenames:
            metafunc.parametrize("optimizer_case", list(self.optimizer_cases))
        if "matrix_shape" in metafunc.fixturenames:
            metafunc.parametrize("matrix_shape", [ModelShape(*dims) for dims in self.shape_matrix],
                                 ids=[matrix_id(dims) for dims in self.shape_matrix])

    @pytest.fixture(autouse=True)
    def _declared_skips(self, request: pytest.FixtureRequest) -> None:
        for reason, tests in self.skip.items():
            if request.node.originalname in tests:
                pytest.skip(f"declared by {type(self).__name__}: {reason}")
        # Skip (or fail) before any numpy_ref reference work when the backend cannot run here at all.
        if self.backend_name:
            _entry(self.backend_name, self.extra_plugins)

    def tol(self, name: str) -> float:
        override = getattr(self, f"{name}_tol")
        if override is not None:
            return float(override)
        if self.precision not in DEFAULT_TOLERANCES:
            raise ValueError(f"precision must be one of {sorted(DEFAULT_TOLERANCES)}, not {self.precision!r}")
        return getattr(DEFAULT_TOLERANCES[self.precision], name)

    def shape(self, d_model: int) -> ModelShape:
        return ModelShape(d_model, self.heads_for(d_model))

    def open(self, d_model: int, max_batch: int | None = None) -> AbstractContextManager[ValidatedSession]:
        """A validated session of the backend under test (skips or fails when it cannot run here)."""
        if not self.backend_name:
            raise TypeError(f"{type(self).__name__} must set backend_name")
        entry = _entry(self.backend_name, self.extra_plugins)
        shape, batch = self.shape(d_model), max_batch or self.batch
        assert entry.spec is not None
        reason = entry.spec.unsupported_reason(shape, batch, self.dtype)
        if reason:
            _unusable(self.backend_name, reason)
        return _session(entry, shape, batch, self.dtype)

    def open_shape(self, shape: ModelShape, max_batch: int) -> AbstractContextManager[ValidatedSession]:
        """A validated session at any shape; a shape the backend does not support fails (it is in the matrix)."""
        entry = _entry(self.backend_name, self.extra_plugins)
        assert entry.spec is not None
        reason = entry.spec.unsupported_reason(shape, max_batch, self.dtype)
        if reason:
            pytest.fail(f"{self.backend_name} does not run {shape.describe()} from its shape_matrix: {reason}",
                        pytrace=False)
        return _session(entry, shape, max_batch, self.dtype)

    def open_reference(self, d_model: int, dtype: str = "float64") -> AbstractContextManager[ValidatedSession]:
        return _session(_reference_entry(self.extra_plugins), self.shape(d_model), self.batch, dtype)

    def names(self) -> tuple[str, ...]:
        return load_names(self.names_file).names

    def grad_inputs(self, d_model: int) -> tuple[TrainState, np.ndarray, np.ndarray]:
        params = init_params(self.shape(d_model), self.seed) * np.float32(self.param_scale)
        tokens, lengths = edge_batch(self.names(), self.batch, self.seed)
        return TrainState.fresh(params), tokens, lengths

    def _reference_key(self, d_model: int, *what: object) -> tuple[object, ...]:
        return (self.extra_plugins, self.shape(d_model), self.batch, self.seed, self.names_file, *what)

    def reference_loss_and_grads(self, d_model: int) -> tuple[float, np.ndarray]:
        """numpy_ref float64 on grad_inputs (cached: backends and test classes share one computation)."""
        key = self._reference_key(d_model, "grads", self.param_scale)
        if key not in _REFERENCE_CACHE:
            state, tokens, lengths = self.grad_inputs(d_model)
            with self.open_reference(d_model) as ref:
                ref.set_state(state)
                _REFERENCE_CACHE[key] = ref.loss_and_grads(tokens, lengths)
        loss, grads = _REFERENCE_CACHE[key]
        assert grads is not None
        return loss, grads

    def trajectory_inputs(self, d_model: int) -> tuple[TrainState, np.ndarray, np.ndarray, np.ndarray]:
        n = self.trajectory_steps
        tokens, lengths = make_batches(self.names(), n, self.batch, self.seed + 1)
        lrs = lr_schedule(1, n, n, self.trajectory_lr(d_model))
        return TrainState.fresh(init_params(self.shape(d_model), self.seed)), tokens, lengths, lrs

    def trajectory_windows_at(self) -> list[tuple[int, int]]:
        """(first step, step count) of each window: evenly spread, the first at 0, the last ending at n."""
        n = self.trajectory_steps
        w = min(self.trajectory_window_steps, n)
        starts = np.linspace(0, n - w, max(1, self.trajectory_windows)).round().astype(int)
        return [(int(s), w) for s in sorted(set(starts.tolist()))]

    def trajectory_edges(self) -> list[int]:
        """Every step at which a window starts or ends, with 0 and trajectory_steps."""
        windows = self.trajectory_windows_at()
        return sorted({0, self.trajectory_steps} | {e for s, w in windows for e in (s, s + w)})

    def reference_trajectory(self, d_model: int) -> tuple[np.ndarray, dict[int, TrainState]]:
        """numpy_ref float64 losses over trajectory_inputs and its states at every window edge (cached)."""
        key = self._reference_key(d_model, "trajectory", self.trajectory_steps, self.trajectory_lr(d_model),
                                  tuple(self.trajectory_windows_at()))
        if key not in _REFERENCE_CACHE:
            state, tokens, lengths, lrs = self.trajectory_inputs(d_model)
            edges = self.trajectory_edges()
            losses, states = [], {}
            with self.open_reference(d_model, "float64") as ref:
                ref.set_state(state)
                for start, stop in itertools.pairwise(edges):
                    states[start] = ref.get_state()
                    losses.append(ref.train_steps(tokens[start:stop], lengths[start:stop], lrs[start:stop]))
                states[edges[-1]] = ref.get_state()
            _REFERENCE_CACHE[key] = (np.concatenate(losses).astype(np.float64), states)
        return _REFERENCE_CACHE[key]

    def optimizer_reference(self, d_model: int, opt: OptimizerSettings) -> OptimizerReference:
        """spec_training over trajectory_inputs with `opt`, its states at the window edges and its power (cached)."""
        key = self._reference_key(d_model, "optimizer", opt, self.trajectory_steps, self.trajectory_lr(d_model),
                                  tuple(self.trajectory_windows_at()))
        if key not in _REFERENCE_CACHE:
            shape = self.shape(d_model)
            state, tokens, lengths, lrs = self.trajectory_inputs(d_model)
            edges = self.trajectory_edges()
            losses, norms, states = [], [], {0: state}
            for start, stop in itertools.pairwise(edges):
                part = slice(start, stop)
                got, states[stop], got_norms = spec_training(shape, states[start], tokens[part], lengths[part],
                                                             lrs[part], opt)
                losses.append(got)
                norms.append(got_norms)
            power = 0.0
            for start, w in self.trajectory_windows_at():
                if start == 0:  # no Adam history: not judged by its parameters (test_loss_trajectory_matches_reference)
                    continue
                part, begin = slice(start, start + w), states[start]
                _, plain, _ = spec_training(shape, begin, tokens[part], lengths[part], lrs[part], DEFAULT_OPTIMIZER)
                moved = states[start + w].params - begin.params
                power = max(power, relative_errors(plain.params - begin.params, moved)[0])
            _REFERENCE_CACHE[key] = OptimizerReference(np.concatenate(losses), states, np.concatenate(norms), power)
        result: OptimizerReference = _REFERENCE_CACHE[key]
        return result

    @contextmanager
    def open_with_optimizer(self, d_model: int, opt: OptimizerSettings) -> Iterator[ValidatedSession]:
        """A validated session given `opt`; skipped, saying why, when the backend's sessions have no
        set_optimizer (a backend written before the optimiser settings: the trainer refuses them on it)."""
        with self.open(d_model) as session:
            if not session.takes_optimizer:
                pytest.skip(f"{self.backend_name}: its sessions have no set_optimizer, so it runs only the default "
                            "optimiser (the trainer refuses other settings on it)")
            session.set_optimizer(opt)
            yield session

    # -- the checks --
    def test_loss_matches_reference(self, d_model: int) -> None:
        state, tokens, lengths = self.grad_inputs(d_model)
        want, _ = self.reference_loss_and_grads(d_model)
        with self.open(d_model) as session:
            session.set_state(state)
            got, grads = session.loss_and_grads(tokens, lengths, want_grads=False)
        rel = abs(got - want) / abs(want)
        print(f"d{d_model}: loss {got:.7f} vs reference {want:.7f} (relative error {rel:.2e})")
        assert grads is None
        assert rel <= self.tol("loss_rel"), f"loss {got} differs from reference {want} by {rel:.2e}"

    def test_gradients_match_reference(self, d_model: int) -> None:
        state, tokens, lengths = self.grad_inputs(d_model)
        _, want = self.reference_loss_and_grads(d_model)
        with self.open(d_model) as session:
            session.set_state(state)
            _, got = session.loss_and_grads(tokens, lengths)
        assert got is not None and got.shape == want.shape
        errors = per_tensor_errors(self.shape(d_model), got, want)
        for name, (rms, worst) in errors.items():
            print(f"d{d_model} {name:>8}: relative RMS error {rms:.2e}, max {worst:.2e}")
        bad = {
            name: e for name, e in errors.items()
            if not (e[0] <= self.tol("grad_rel_rms") and e[1] <= self.tol("grad_rel_max"))
        }
        assert not bad, f"gradients off beyond (rms {self.tol('grad_rel_rms')}, max " \
            f"{self.tol('grad_rel_max')}): {bad}"

    def test_one_adam_step_matches_reference(self, d_model: int) -> None:
        params, tokens, lengths = self.grad_inputs(d_model)
        state = _state_of(params.params, self.seed, step=5)
        tokens, lengths = tokens[None], lengths[None]
        lrs = np.array([self.adam_lr], np.float32)
        with self.open_reference(d_model) as ref:
            ref.set_state(state)
            ref.train_steps(tokens, lengths, lrs)
            want = ref.get_state()
        with self.open(d_model) as session:
            session.set_state(state)
            session.train_steps(tokens, lengths, lrs)
            got = session.get_state()
        self.check_one_step(f"d{d_model}", got, want)

    def check_one_step(self, tag: str, got: TrainState, want: TrainState) -> float:
        """test_one_adam_step_matches_reference's bounds on the state after one update from step 5; returns the
        largest parameter error (in units of lr)."""
        assert got.step == want.step == 6
        param_err = float(np.max(np.abs(got.params.astype(np.float64) - want.params))) / self.adam_lr
        m_err = relative_errors(got.adam_m, want.adam_m)[1]
        v_err = relative_errors(got.adam_v, want.adam_v)[1]
        print(f"{tag}: max param error {param_err:.2e} x lr; moment max errors m {m_err:.2e} v {v_err:.2e}")
        assert param_err <= self.tol("adam_param"), \
            f"{tag}: the parameters are off by {param_err:.2e} x lr (bound {self.tol('adam_param')})"
        assert m_err <= self.tol("adam_moment") and v_err <= self.tol("adam_moment"), \
            f"{tag}: the moments are off by {max(m_err, v_err):.2e} (bound {self.tol('adam_moment')})"
        return param_err

    def test_optimizer_step_matches_reference(self, d_model: int, optimizer_case: str) -> None:
        """One update with the case's optimiser from a state with Adam history, against spec_training; the
        same update with the default optimiser must land measurably elsewhere (else the check proves nothing)."""
        opt = self.optimizer_cases[optimizer_case]
        params, tokens, lengths = self.grad_inputs(d_model)
        state = _state_of(params.params, self.seed, step=5)
        tokens, lengths = tokens[None], lengths[None]
        lrs = np.array([self.adam_lr], np.float32)
        with self.open_with_optimizer(d_model, opt) as session:
            session.set_state(state)
            session.train_steps(tokens, lengths, lrs)
            got = session.get_state()
        _, want, norms = spec_training(self.shape(d_model), state, tokens, lengths, lrs, opt)
        _, plain, _ = spec_training(self.shape(d_model), state, tokens, lengths, lrs, DEFAULT_OPTIMIZER)
        power = float(np.max(np.abs(plain.params - want.params))) / self.adam_lr
        print(f"d{d_model} {optimizer_case}: gradient norm {norms[0]:.3g}; the default optimiser's update differs "
              f"by {power:.2e} x lr")
        assert opt.grad_clip == 0 or norms[0] > opt.grad_clip, \
            f"grad_clip {opt.grad_clip:g} does not engage (gradient norm {norms[0]:.3g}): choose a smaller one"
        error = self.check_one_step(f"d{d_model} {optimizer_case}", got, want)
        # One update moves each parameter by about lr at most, so the gap is at most ~1 x lr (0.3-1.1 here:
        # clipping at d16 the least); the fp16 bound is 0.2. A backend that ignored the setting would land
        # `power` from the spec, give or take its own error: the check can fail when that still exceeds the bound.
        assert power - error > self.tol("adam_param"), \
            f"the {optimizer_case} settings change an update by only {power:.2e} x lr, within the bound " \
            f"{self.tol('adam_param')} plus this backend's error {error:.2e}: the check could not fail"

    def test_loss_trajectory_matches_reference(self, d_model: int) -> None:
        """Training follows numpy_ref float64, judged where that is free of chaos.

        Windows: from the reference's float64 state at each window's first step (rounded to the session's
        dtype), the backend runs the window's steps; every loss must match the reference's within
        `trajectory_window`, and in windows that start with Adam history the parameter change within
        `trajectory_window_params` (relative RMS). From zero moments Adam's first update is
        lr * g / (|g| + eps), which two correct backends compute differently where |g| is near eps, so
        the window at step 0 is judged by its losses. This catches a wrong Adam step count or bias
        correction, a shifted learning rate, a dropped position.
        Whole run: all `trajectory_steps` in one call from the initial state; the losses must be finite
        and each quarter's mean within `trajectory` of the reference's (two correct fp32 runs part ways
        step by step but not in their averages).
        """
        state, tokens, lengths, lrs = self.trajectory_inputs(d_model)
        want, ref_states = self.reference_trajectory(d_model)
        with self.open(d_model) as session:
            self.check_trajectory(session, d_model, state, (tokens, lengths, lrs), want, ref_states)

    def check_trajectory(self, session: ValidatedSession, d_model: int, state: TrainState,
                         inputs: tuple[np.ndarray, np.ndarray, np.ndarray], want: np.ndarray,
                         ref_states: dict[int, TrainState], label: str = "") -> None:
        """The windows and the whole run of test_loss_trajectory_matches_reference (whose docstring says what
        is judged) on an open session, against a reference's losses and its states at the window edges."""
        n = self.trajectory_steps
        tokens, lengths, lrs = inputs
        dtype = np.dtype(self.dtype)
        window_loss, window_params = 0.0, 0.0
        tag = f"d{d_model}{label}"
        for start, w in self.trajectory_windows_at():
            begin, end = ref_states[start], ref_states[start + w]
            session.set_state(TrainState(begin.params.astype(dtype), begin.adam_m.astype(dtype),
                                         begin.adam_v.astype(dtype), begin.step))
            got = session.train_steps(tokens[start:start + w], lengths[start:start + w], lrs[start:start + w])
            after = session.get_state()
            assert after.step == start + w, f"window at step {start}: step {after.step}, not {start + w}"
            loss_diff = float(np.max(np.abs(got.astype(np.float64) - want[start:start + w])))
            params_err = relative_errors(after.params - begin.params, end.params - begin.params)[0]
            print(f"{tag}: window of {w} steps from step {start}: loss difference {loss_diff:.2e}, "
                  f"parameter change relative RMS error {params_err:.2e}"
                  f"{' (not checked: no Adam history yet)' if start == 0 else ''}")
            window_loss = max(window_loss, loss_diff)
            if start > 0:
                window_params = max(window_params, params_err)
        session.set_state(state)
        got = session.train_steps(tokens, lengths, lrs)
        final_step = session.get_state().step
        assert got.shape == (n,) and np.all(np.isfinite(got)), "the whole run's losses must be finite"
        assert final_step == n
        quarters = [slice(q * n // 4, (q + 1) * n // 4) for q in range(4) if (q + 1) * n // 4 > q * n // 4]
        mean_diff = max(abs(float(np.mean(got[q], dtype=np.float64) - np.mean(want[q]))) for q in quarters)
        step_diff = np.abs(got.astype(np.float64) - want)
        print(f"{tag}: whole run of {n} steps: quarter means differ by at most {mean_diff:.2e} "
              f"(largest single-step difference {step_diff.max():.2e} at step {int(np.argmax(step_diff)) + 1}, "
              f"not checked); final loss {got[-1]:.4f}")
        assert window_loss <= self.tol("trajectory_window"), \
            f"a loss in a window differs by {window_loss:.2e} (bound {self.tol('trajectory_window')})"
        assert window_params <= self.tol("trajectory_window_params"), \
            f"a window's parameter change is off by {window_params:.2e} relative RMS " \
            f"(bound {self.tol('trajectory_window_params')})"
        assert mean_diff <= self.tol("trajectory"), \
            f"the whole run's quarter-mean losses differ by {mean_diff:.2e} (bound {self.tol('trajectory')})"

    def test_optimizer_training_follows_reference(self, d_model: int, optimizer_case: str) -> None:
        """test_loss_trajectory_matches_reference's windows and whole run with the case's optimiser, against
        spec_training (the float64 specification: reference gradients and optim.adam_update). The case must
        matter: a clip engages at every step, and in some window the default optimiser moves the parameters
        differently by OPTIMIZER_POWER times the bound, so a backend ignoring the setting fails here."""
        opt = self.optimizer_cases[optimizer_case]
        assert any(start > 0 for start, _ in self.trajectory_windows_at()), \
            f"{type(self).__name__}: every trajectory window starts at step 0, where parameters are not judged, so " \
            "the settings could not show: give it trajectory_windows >= 2 or declare this test in `skip`"
        state, tokens, lengths, lrs = self.trajectory_inputs(d_model)
        with self.open_with_optimizer(d_model, opt) as session:
            ref = self.optimizer_reference(d_model, opt)
            print(f"d{d_model} {optimizer_case}: gradient norms {ref.norms.min():.3g}-{ref.norms.max():.3g}; the "
                  f"default optimiser's parameter change differs by up to {ref.power:.2e} relative RMS")
            assert opt.grad_clip == 0 or bool(np.all(ref.norms > opt.grad_clip)), \
                f"grad_clip {opt.grad_clip:g} does not engage at every step (the gradient norm falls to " \
                f"{ref.norms.min():.3g}): choose a smaller one"
            bound = self.tol("trajectory_window_params")
            assert ref.power > OPTIMIZER_POWER * bound, \
                f"the {optimizer_case} settings change the windows by only {ref.power:.2e} (bound {bound}): the " \
                "check could not fail"
            self.check_trajectory(session, d_model, state, (tokens, lengths, lrs), ref.losses, ref.states,
                                  label=f" {optimizer_case}")

    def test_state_round_trip(self, d_model: int) -> None:
        params = init_params(self.shape(d_model), self.seed)
        state = _state_of(params, self.seed + 2, step=123)
        with self.open(d_model) as session:
            session.set_state(state)
            got = session.get_state()
            got.params[:] = 0  # get_state must hand out copies
            again = session.get_state()
        for name in STATE_ARRAYS:
            np.testing.assert_array_equal(getattr(again, name), getattr(state, name), err_msg=name)
        assert again.step == 123

    def test_determinism(self, d_model: int) -> None:
        n = max(2, min(10, self.trajectory_steps))
        tokens, lengths = make_batches(self.names(), n, self.batch, self.seed + 3)
        lrs = lr_schedule(1, n, n, self.trajectory_lr(d_model))
        state = TrainState.fresh(init_params(self.shape(d_model), self.seed))
        runs = []
        for _ in range(2):
            with self.open(d_model) as session:
                session.set_state(state)
                losses = session.train_steps(tokens, lengths, lrs)
                runs.append((losses, session.get_state()))
        (first, s1), (second, s2) = runs
        np.testing.assert_array_equal(first, second)
        for name in STATE_ARRAYS:
            np.testing.assert_array_equal(getattr(s1, name), getattr(s2, name), err_msg=name)
        assert s1.step == s2.step == n

    def test_thread_count_changes_no_bit(self, d_model: int) -> None:
        """A backend declaring BackendSpec.thread_independent: 1, 2 and 3 threads, and a count switched between
        calls (what threads: auto does), train bit-identical losses, parameters and moments."""
        entry = _entry(self.backend_name, self.extra_plugins)
        if entry.spec is None or not entry.spec.thread_independent:
            pytest.skip(f"{self.backend_name} does not declare thread_independent")
        n = 6
        tokens, lengths = make_batches(self.names(), n, self.batch, self.seed + 4)
        lrs = lr_schedule(1, n, n, self.trajectory_lr(d_model))
        start = TrainState.fresh(init_params(self.shape(d_model), self.seed))
        runs = []
        for counts in ((1,), (2,), (3,), (2, 1, 3)):
            with self.open(d_model) as session:
                session.set_state(start)
                parts = []
                for i in range(n):
                    session.set_threads(counts[i % len(counts)])
                    parts.append(session.train_steps(tokens[i : i + 1], lengths[i : i + 1], lrs[i : i + 1]))
                runs.append((counts, np.concatenate(parts), session.get_state()))
        _, want, want_state = runs[0]
        for counts, losses, state in runs[1:]:
            np.testing.assert_array_equal(losses, want, err_msg=f"threads {counts}")
            for name in STATE_ARRAYS:
                np.testing.assert_array_equal(getattr(state, name), getattr(want_state, name),
                                              err_msg=f"{name}, threads {counts}")

    def test_loss_and_grads_leaves_state_unchanged(self, d_model: int) -> None:
        params, tokens, lengths = self.grad_inputs(d_model)
        state = _state_of(params.params, self.seed, step=7)
        with self.open(d_model) as session:
            session.set_state(state)
            loss1, grads1 = session.loss_and_grads(tokens, lengths)
            loss2, _ = session.loss_and_grads(tokens, lengths, want_grads=False)
            loss3, grads3 = session.loss_and_grads(tokens, lengths)
            after = session.get_state()
        assert loss1 == loss2 == loss3
        np.testing.assert_array_equal(grads1, grads3)
        for name in STATE_ARRAYS:
            np.testing.assert_array_equal(getattr(after, name), getattr(state, name), err_msg=name)
        assert after.step == 7

    @pytest.mark.parametrize("case", list(BAD_INPUTS))
    def test_rejects_bad_input(self, case: str) -> None:
        d_model = self.d_models[0]
        max_batch = 4
        tokens, lengths = make_batches(self.names(), 2, max_batch, self.seed)
        lrs = np.full(2, 0.01, np.float32)
        state = TrainState.fresh(init_params(self.shape(d_model), self.seed))
        with self.open(d_model, max_batch=max_batch) as session:
            session.set_state(state)
            with pytest.raises(BatchError) as info:
                BAD_INPUTS[case](session, tokens.copy(), lengths.copy(), lrs.copy())
            after = session.get_state()
        print(f"{case}: {info.value}")
        assert str(info.value).strip(), "the error needs a message"
        np.testing.assert_array_equal(after.params, state.params)
        assert after.step == 0

    # -- the session contract beyond the maths (docs/writing-a-backend.md) --
    def test_chunked_calls_match_one_call(self, d_model: int) -> None:
        """Calls of chunk_sizes steps end where one call of their sum does: no call skips its last update."""
        chunks = self.chunk_sizes
        n = sum(chunks)
        tokens, lengths = make_batches(self.names(), n, self.batch, self.seed + 4)
        lrs = np.full(n, self.adam_lr, np.float32)  # constant: a schedule would make the last update tiny
        start = TrainState.fresh(init_params(self.shape(d_model), self.seed))
        with self.open(d_model) as session:
            session.set_state(start)
            whole = session.train_steps(tokens, lengths, lrs)
            one_call = session.get_state()
        pieces, done = [], 0
        with self.open(d_model) as session:
            session.set_state(start)
            for k in chunks:
                part = slice(done, done + k)
                pieces.append(session.train_steps(tokens[part], lengths[part], lrs[part]))
                done += k
                counted = int(session.get_state().step)
                assert counted == done, f"after a call of {k} steps the state says step {counted}, not {done}"
            chunked = session.get_state()
        loss_diff = float(np.max(np.abs(np.concatenate(pieces).astype(np.float64) - whole)))
        param_diff = float(np.max(np.abs(chunked.params.astype(np.float64) - one_call.params))) / self.adam_lr
        print(f"d{d_model}: calls of {chunks} vs one call of {n}: largest loss difference {loss_diff:.2e}, "
              f"largest parameter difference {param_diff:.2e} x lr")
        assert int(one_call.step) == n
        assert loss_diff <= self.tol("trajectory_window"), "the losses depend on how the steps are split into calls"
        assert param_diff <= self.tol("adam_param"), "the parameters depend on how the steps are split into calls"

    def test_session_returns_declared_types(self, d_model: int) -> None:
        """losses float32 [n]; state arrays `state_dtype` [n_params] and a non-negative int step; all finite."""
        shape = self.shape(d_model)
        tokens, lengths = make_batches(self.names(), 2, self.batch, self.seed + 6)
        lrs = np.full(2, self.adam_lr, np.float32)
        with self.open(d_model) as session:
            session.set_state(TrainState.fresh(init_params(shape, self.seed)))
            losses = session.train_steps(tokens, lengths, lrs)
            state = session.get_state()
            loss, grads = session.loss_and_grads(tokens[0], lengths[0])
            loss_only, none = session.loss_and_grads(tokens[0], lengths[0], want_grads=False)
        assert isinstance(losses, np.ndarray), f"train_steps returned {type(losses).__name__}, not an ndarray"
        assert losses.dtype == np.float32 and losses.shape == (2,), f"losses are {losses.dtype} {losses.shape}"
        assert np.all(np.isfinite(losses))
        assert isinstance(state, TrainState), f"get_state returned {type(state).__name__}, not a TrainState"
        for name in STATE_ARRAYS:
            array = getattr(state, name)
            assert isinstance(array, np.ndarray), f"state.{name} is {type(array).__name__}"
            assert array.dtype == np.dtype(self.state_dtype), f"state.{name} is {array.dtype}, not {self.state_dtype}"
            assert array.shape == (shape.n_params,), f"state.{name} has shape {array.shape}"
            assert np.all(np.isfinite(array)), f"state.{name} holds non-finite values"
        assert isinstance(state.step, (int, np.integer)) and not isinstance(state.step, bool)
        assert state.step == 2
        assert isinstance(loss, (float, np.floating)) and np.isfinite(loss), f"loss is {loss!r}"
        assert isinstance(loss_only, (float, np.floating)) and loss_only == loss
        assert none is None
        assert isinstance(grads, np.ndarray) and grads.shape == (shape.n_params,)
        assert grads.dtype == np.dtype(self.state_dtype) and np.all(np.isfinite(grads))

    def test_non_finite_update_raises(self, d_model: int) -> None:
        """An update that overflows the parameters must raise, not return and leave them non-finite.

        The loss of the step (computed before its update) is finite; the Adam moment m is near the float32
        maximum and v is 0, so lr * m / (sqrt(v) + eps) overflows wherever the gradient is small.
        """
        params = init_params(self.shape(d_model), self.seed)
        n = params.size
        state = TrainState(params, np.full(n, 3e38, np.float32), np.zeros(n, np.float32), 1000)
        tokens, lengths = make_batches(self.names(), 1, self.batch, self.seed + 5)
        with self.open(d_model) as session:
            session.set_state(state)
            try:
                session.train_steps(tokens, lengths, np.array([self.adam_lr], np.float32))
            except Exception as exc:
                # NonFiniteError (native EMG_ERR_NONFINITE, numpy_ref); a Python backend's FloatingPointError.
                if not isinstance(exc, (NonFiniteError, FloatingPointError)):
                    raise
                print(f"d{d_model}: refused as required: {type(exc).__name__}: {exc}")
                return
            after = session.get_state()
        bad = [name for name in STATE_ARRAYS if not np.all(np.isfinite(getattr(after, name)))]
        assert not bad, (
            f"train_steps returned normally but left non-finite {', '.join(bad)}; it must raise "
            "(FloatingPointError in Python, EMG_ERR_NONFINITE from native code)"
        )

    # -- the shape matrix --
    def _matrix_reference(self, shape: ModelShape, what: str, compute: Callable[[], Any]) -> Any:
        key = (self.extra_plugins, shape, self.matrix_batch, self.seed, what)
        if key not in _REFERENCE_CACHE:
            _REFERENCE_CACHE[key] = compute()
        return _REFERENCE_CACHE[key]

    def _matrix_grad_inputs(self, shape: ModelShape) -> tuple[TrainState, np.ndarray, np.ndarray]:
        params = init_params(shape, self.seed) * np.float32(self.param_scale)
        tokens, lengths = synthetic_batches(shape, 1, self.matrix_batch, self.seed)
        return TrainState.fresh(params), tokens[0], lengths[0]

    def test_matrix_gradients_match_reference(self, matrix_shape: ModelShape) -> None:
        state, tokens, lengths = self._matrix_grad_inputs(matrix_shape)

        def reference() -> tuple[float, np.ndarray | None]:
            with _session(_reference_entry(self.extra_plugins), matrix_shape, self.matrix_batch, "float64") as ref:
                ref.set_state(state)
                return ref.loss_and_grads(tokens, lengths)

        want_loss, want = self._matrix_reference(matrix_shape, "grads", reference)
        with self.open_shape(matrix_shape, self.matrix_batch) as session:
            session.set_state(state)
            got_loss, got = session.loss_and_grads(tokens, lengths)
        assert got is not None and want is not None
        rel = abs(got_loss - want_loss) / abs(want_loss)
        assert rel <= self.tol("loss_rel"), f"loss {got_loss} vs reference {want_loss}: {rel:.2e}"
        errors = per_tensor_errors(matrix_shape, got, want)
        worst = max(errors, key=lambda name: errors[name][0])
        print(f"{matrix_shape.describe()}: loss rel {rel:.1e}, worst gradient {worst} "
              f"rms {errors[worst][0]:.1e} max {max(e[1] for e in errors.values()):.1e}")
        for name, (rms, mx) in errors.items():
            assert rms <= self.tol("grad_rel_rms"), f"{name}: RMS relative error {rms:.2e}"
            assert mx <= self.tol("grad_rel_max"), f"{name}: max relative error {mx:.2e}"

    def test_matrix_training_window_matches_reference(self, matrix_shape: ModelShape) -> None:
        n = self.matrix_window_steps
        tokens, lengths = synthetic_batches(matrix_shape, n, self.matrix_batch, self.seed + 1)
        lrs = np.full(n, self.matrix_lr, np.float32)
        # With Adam history, as the per-d_model windows after step 0: from zero moments the first update is
        # lr * sign(g), so a gradient that two correct fp32 implementations round differently (a ReLU input
        # within rounding of 0 flips one mask element) moves the parameters by visibly different amounts
        # (measured, neon at d64h4L2V256C64: loss 5.2e-4 and parameter change 2.2e-2 relative RMS from the
        # float64 reference when fresh; 4.8e-7 and 1.4e-4 from this state).
        start = _state_of(init_params(matrix_shape, self.seed), self.seed + 1, step=10)

        def reference() -> tuple[np.ndarray, TrainState]:
            with _session(_reference_entry(self.extra_plugins), matrix_shape, self.matrix_batch, "float64") as ref:
                ref.set_state(start)
                losses = ref.train_steps(tokens, lengths, lrs)
                return losses, ref.get_state()

        want_losses, want_state = self._matrix_reference(matrix_shape, f"window{n}", reference)
        with self.open_shape(matrix_shape, self.matrix_batch) as session:
            session.set_state(start)
            got_losses = session.train_steps(tokens, lengths, lrs)
            got_state = session.get_state()
        assert got_state.step == start.step + n
        worst = float(np.max(np.abs(got_losses.astype(np.float64) - want_losses)))
        assert worst <= self.tol("trajectory_window"), f"losses differ by up to {worst:.2e}"
        moved_got = got_state.params.astype(np.float64) - start.params
        moved_want = want_state.params.astype(np.float64) - start.params
        rms, _ = relative_errors(moved_got, moved_want)
        assert rms <= self.tol("trajectory_window_params"), f"parameter change differs: relative RMS {rms:.2e}"

    def test_matrix_determinism(self, matrix_shape: ModelShape) -> None:
        # Two steps: one from zero moments and one with Adam history, every kernel of the step in both; each
        # rerun is a whole session, so the steps' cost counts twice (under the aarch64 lane's emulation a third
        # step cost 16 s a run at d256h64L1V27C16).
        tokens, lengths = synthetic_batches(matrix_shape, 2, self.matrix_batch, self.seed + 2)
        lrs = np.full(2, self.matrix_lr, np.float32)
        start = TrainState.fresh(init_params(matrix_shape, self.seed))
        runs = []
        for _ in range(2):
            with self.open_shape(matrix_shape, self.matrix_batch) as session:
                session.set_state(start)
                losses = session.train_steps(tokens, lengths, lrs)
                runs.append((losses, session.get_state().params))
        assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
