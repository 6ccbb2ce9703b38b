"""The native ABI contract as a pytest class: every native backend must answer every fault the same way.

A native backend's tests subclass it with two lines:

    class TestMyAbi(NativeAbiContract):
        backend_name = "mybackend"
        def library_path(self): return find_library(PACKAGE_DIR, "_mylib")

The checks call the library through the core's own loader (native.load_library, cffi ABI mode) on the
smallest shape it supports, and assert the status codes and the state afterwards (bit for bit) for bad
arguments and batches (the ABI's bounds included: lengths are uint16), optimiser settings out of range,
non-finite learning rates, losses and updates, the step/loss bookkeeping of emg_train_steps, and one AdamW
step with non-default settings against the reference (optim.adam_update). The rules themselves live in
include/emg_backend.h; a backend built on it passes by construction, and one that is not must match it.
Unavailable backends are skipped (or fail when EEMICROGPT_REQUIRE_BACKENDS names them), as in the conformance
kit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ..backends.native import ABI_VERSION, STATUS, _ffi, load_library
from ..base.abi import (
    D_MODEL_STEP,
    LENGTH_DTYPE,
    MAX_CONTEXT,
    MAX_D_MODEL,
    MAX_LAYERS,
    MAX_NATIVE_BATCH,
    MAX_VOCAB,
    MIN_VOCAB,
)
from ..model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, adam_update
from ..model.shape import NAMES_VOCAB, ModelShape, init_params, views
from .conformance import _entry, _unusable

OK, ARGUMENT, UNSUPPORTED, NOMEM, NONFINITE = (STATUS[name] for name in (
    "EMG_OK", "EMG_ERR_ARGUMENT", "EMG_ERR_UNSUPPORTED", "EMG_ERR_NOMEM", "EMG_ERR_NONFINITE"))
# Shapes tried in order (one layer, the names' vocabulary, context 16); the first one the library supports
# is the one under test.
CANDIDATE_SHAPES = ((16, 4), (32, 4), (64, 4), (64, 8), (128, 4), (128, 8))
# (d_model, n_heads, n_layers, vocab, context) that ModelShape refuses, each breaking one rule (the ABI's
# bounds: one width step past the widest, one layer more, a context of 257, whose length 258 needs uint16).
INVALID_SHAPES = ((16, 3, 1, 27, 16), (16, 8, 1, 27, 16), (0, 4, 1, 27, 16), (-16, 4, 1, 27, 16), (16, 0, 1, 27, 16),
                  (16, -4, 1, 27, 16), (64, 4, 0, 27, 16), (64, 4, MAX_LAYERS + 1, 27, 16),
                  (MAX_D_MODEL + D_MODEL_STEP, 4, 1, 27, 16), (64, 4, 1, MIN_VOCAB - 1, 16),
                  (64, 4, 1, MAX_VOCAB + 1, 16), (64, 4, 1, 27, 0), (64, 4, 1, 27, MAX_CONTEXT + 1))
# Settings emg_set_optimizer must refuse, each breaking one range of emg_optimizer (NaN in every field; 1 - 1e-9
# is below 1 in double but 1.0 as the float32 the library receives).
_NAN, _INF = float("nan"), float("inf")
BAD_OPTIMIZERS = tuple(OptimizerSettings(**{field: value}) for field, value in (
    ("beta1", _NAN), ("beta1", 1.0), ("beta1", 1.0 - 1e-9), ("beta1", -0.1), ("beta2", _NAN), ("beta2", 1.0),
    ("beta2", -1e-3), ("eps", _NAN), ("eps", 0.0), ("eps", -1e-8), ("eps", _INF), ("weight_decay", _NAN),
    ("weight_decay", -0.1), ("weight_decay", _INF), ("grad_clip", _NAN), ("grad_clip", -1.0), ("grad_clip", _INF),
    ("grad_clip", 1e31)))
# Non-default settings, each turning on one part of the step (grad_clip: a multiple of the gradient's norm).
OPTIMIZER_CASES = {
    "clip_engaged": {"grad_clip": 0.5},
    "clip_idle": {"grad_clip": 2.0},
    "weight_decay": {"weight_decay": 0.1},
    "betas_eps": {"beta1": 0.9, "beta2": 0.95, "eps": 1e-6},
    "all": {"beta1": 0.8, "beta2": 0.999, "eps": 1e-7, "weight_decay": 0.5, "grad_clip": 0.25},
}
# A second shape, to show the batch rule follows the session's vocabulary and context (tried at each width).
OTHER_SHAPE = {"n_layers": 2, "vocab": 40, "context": 24}
# The non-finite rules run on batches this large: a threaded session then really splits the step (the x86
# backend gives a chunk at least 4 sequences; a smaller batch runs inline and would test nothing threaded).
SESSION_BATCH = 16
STEP_LR = 1e-2  # the optimiser checks' learning rate


@dataclass
class State:
    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int

    def equal(self, other: State) -> bool:
        return self.step == other.step and all(
            np.array_equal(a, b, equal_nan=True)
            for a, b in ((self.params, other.params), (self.m, other.m), (self.v, other.v))
        )


def raw_shape(d_model: int, n_heads: int, n_layers: int = 1, vocab: int = NAMES_VOCAB, context: int = 16) -> Any:
    """An emg_shape with any values, valid or not (ModelShape would refuse the invalid ones)."""
    return _ffi().new("emg_shape *", {"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers, "vocab": vocab,
                                      "context": context})


def shape_of(shape: ModelShape) -> Any:
    return raw_shape(shape.d_model, shape.n_heads, shape.n_layers, shape.vocab, shape.context)


def optimizer_of(opt: OptimizerSettings) -> Any:
    """An emg_optimizer with any values (the fields are OptimizerSettings', named as in C)."""
    return _ffi().new("emg_optimizer *", dataclasses.asdict(opt))


def as_float32(opt: OptimizerSettings) -> OptimizerSettings:
    """The settings as the library holds them (each rounded to float32)."""
    return OptimizerSettings(**{k: float(np.float32(v)) for k, v in dataclasses.asdict(opt).items()})


class Raw:
    """One emg_session opened directly through cffi (no Python-side checks in the way)."""

    def __init__(self, lib: Any, shape: ModelShape, max_batch: int = SESSION_BATCH, threads: int = 1) -> None:
        self.ffi, self.lib, self.shape = _ffi(), lib, shape
        out = self.ffi.new("emg_session **")
        assert lib.emg_create(shape_of(shape), max_batch, out) == OK
        self.s = out[0]
        if threads != 1:  # the optional emg_set_threads export: every rule holds on the threaded path too
            assert lib.emg_set_threads(self.s, threads) == OK

    def close(self) -> None:
        self.lib.emg_destroy(self.s)

    # (the ignores: cffi's stubs want a Buffer, and numpy's stubs call ndarray one only from Python 3.12)
    def f32(self, a: np.ndarray | None) -> Any:
        return self.ffi.NULL if a is None else self.ffi.cast("float *", self.ffi.from_buffer(a))  # type: ignore[call-overload]

    def u8(self, a: np.ndarray | None) -> Any:
        return self.ffi.NULL if a is None else self.ffi.cast("uint8_t *", self.ffi.from_buffer(a))  # type: ignore[call-overload]

    def u16(self, a: np.ndarray | None) -> Any:
        assert a is None or a.dtype == LENGTH_DTYPE
        return self.ffi.NULL if a is None else self.ffi.cast("uint16_t *", self.ffi.from_buffer(a))  # type: ignore[call-overload]

    def set_optimizer(self, opt: OptimizerSettings | None) -> int:
        """emg_set_optimizer with any values (None: a NULL pointer)."""
        if opt is None:
            return self.lib.emg_set_optimizer(self.s, self.ffi.NULL)
        return self.lib.emg_set_optimizer(self.s, optimizer_of(opt))

    def set(self, st: State) -> int:
        return self.lib.emg_set_state(self.s, self.f32(st.params), self.f32(st.m), self.f32(st.v), st.step)

    def get(self) -> State:
        n = self.shape.n_params
        st = State(np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, np.float32), 0)
        step = self.ffi.new("int64_t *")
        assert self.lib.emg_get_state(self.s, self.f32(st.params), self.f32(st.m), self.f32(st.v), step) == OK
        st.step = int(step[0])
        return st

    def train(self, tokens: np.ndarray | None, lengths: np.ndarray | None, lrs: np.ndarray | None,
              losses: np.ndarray | None, n: int | None = None, batch: int | None = None) -> int:
        n = n if n is not None else (len(lrs) if lrs is not None else 1)
        batch = batch if batch is not None else (tokens.shape[1] if tokens is not None else 2)
        return self.lib.emg_train_steps(self.s, n, batch, self.u8(tokens), self.u16(lengths), self.f32(lrs),
                                        self.f32(losses))

    def loss(self, tokens: np.ndarray | None, lengths: np.ndarray | None, grads: bool = True,
             batch: int | None = None) -> tuple[int, float, np.ndarray | None]:
        batch = batch if batch is not None else (tokens.shape[0] if tokens is not None else 2)
        loss = self.ffi.new("float *")
        g = np.empty(self.shape.n_params, np.float32) if grads else None
        status = self.lib.emg_loss_and_grad(self.s, batch, self.u8(tokens), self.u16(lengths), loss, self.f32(g))
        return status, float(loss[0]), g


def batches(n: int, batch: int, seed: int, avoid: int | None = None,
            shape: ModelShape | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n random valid batches (tokens [n, batch, context + 1], lengths [n, batch]) never using token `avoid`
    (the shape's vocabulary and context; by default the names' 27 tokens and context 16)."""
    shape = shape or ModelShape(16)
    rng = np.random.default_rng(seed)
    seq, boundary = shape.seq_len, shape.boundary
    letters = np.array([t for t in range(boundary) if t != avoid], np.uint8)
    tokens = np.zeros((n, batch, seq), np.uint8)
    lengths = rng.integers(3, seq + 1, size=(n, batch)).astype(LENGTH_DTYPE)
    for i in range(n):
        for b in range(batch):
            length = int(lengths[i, b])
            tokens[i, b, 0] = tokens[i, b, length - 1] = boundary
            tokens[i, b, 1 : length - 1] = rng.choice(letters, length - 2)
    return tokens, lengths


def fresh(shape: ModelShape, seed: int = 0, step: int = 0) -> State:
    params = init_params(shape, seed)
    rng = np.random.default_rng(seed + 1)
    m = (rng.standard_normal(shape.n_params) * 1e-3).astype(np.float32)
    v = (rng.random(shape.n_params) * 1e-5).astype(np.float32)
    return State(params, m, v, step)


# Each case breaks one property of the valid batch made of the first 2 rows of tokens [B, S], lengths [B]
# (B = SESSION_BATCH + 1, so that "batch_over_max" still hands C arrays as large as the batch it names).
def _break(case: str, tokens: np.ndarray, lengths: np.ndarray,
           shape: ModelShape) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    tokens, lengths, batch = tokens.copy(), lengths.copy(), 2
    seq = shape.seq_len
    if case == "batch_0":
        batch = 0
    elif case == "batch_over_max":
        batch = SESSION_BATCH + 1
    elif case == "length_1":
        lengths[1] = 1
    elif case == "length_over_context":
        lengths[1] = seq + 1
    elif case == "length_wraps_uint8":  # read as 16 bits: 256 + a valid length, which a uint8 would wrap to
        lengths[1] = 256 + int(lengths[1])
    elif case == "token_vocab_live":
        tokens[1, 1] = shape.vocab
    elif case == "token_vocab_padding":
        tokens[1, seq - 1] = 255
        lengths[1] = min(int(lengths[1]), seq - 1)
    elif case == "null_tokens":
        return None, lengths, batch
    elif case == "null_lengths":
        return tokens, None, batch
    return tokens, lengths, batch


BAD_BATCHES = ("batch_0", "batch_over_max", "length_1", "length_over_context", "length_wraps_uint8",
               "token_vocab_live", "token_vocab_padding", "null_tokens", "null_lengths")


class NativeAbiContract:
    backend_name: ClassVar[str] = ""
    threads: ClassVar[int] = 1  # > 1: every session is split across that many threads (emg_set_threads)

    def library_path(self) -> Path | str | None:
        raise NotImplementedError("return the path of the backend's shared library (None when not built)")

    @pytest.fixture
    def lib(self) -> Any:
        _entry(self.backend_name, ())  # skips (or fails when required) an unavailable backend
        path = self.library_path()
        if path is None:
            _unusable(self.backend_name, "its native library was not built")
        return load_library(str(path))

    @pytest.fixture
    def shape(self, lib: Any) -> ModelShape:
        for d, h in CANDIDATE_SHAPES:
            if lib.emg_supports(raw_shape(d, h)):
                return ModelShape(d, h)
        pytest.fail(f"{self.backend_name} supports none of {CANDIDATE_SHAPES}")

    def open(self, lib: Any, shape: ModelShape) -> Raw:
        return Raw(lib, shape, threads=self.threads)

    @pytest.fixture
    def raw(self, lib: Any, shape: ModelShape) -> Any:
        session = self.open(lib, shape)
        yield session
        session.close()

    # ---- creation ----------------------------------------------------------------------------------------
    def test_abi_version(self, lib: Any) -> None:
        assert lib.emg_abi_version() == ABI_VERSION

    def test_shapes_the_model_forbids_are_unsupported(self, lib: Any) -> None:
        out = _ffi().new("emg_session **")
        for dims in INVALID_SHAPES:
            assert lib.emg_supports(raw_shape(*dims)) == 0, dims
            assert lib.emg_create(raw_shape(*dims), 1, out) == UNSUPPORTED, dims
            assert out[0] == _ffi().NULL
        assert lib.emg_supports(_ffi().NULL) == 0

    def test_create_arguments(self, lib: Any, shape: ModelShape) -> None:
        ffi, out = _ffi(), _ffi().new("emg_session **")
        assert lib.emg_create(shape_of(shape), 1, ffi.NULL) == ARGUMENT
        assert lib.emg_create(ffi.NULL, 1, out) == ARGUMENT
        assert lib.emg_create(shape_of(shape), 0, out) == ARGUMENT
        assert lib.emg_create(shape_of(shape), -1, out) == ARGUMENT
        assert lib.emg_create(shape_of(shape), MAX_NATIVE_BATCH + 1, out) == UNSUPPORTED
        assert out[0] == ffi.NULL
        lib.emg_destroy(ffi.NULL)  # a no-op

    def test_fresh_session_is_zero(self, raw: Raw) -> None:
        st = raw.get()
        assert st.step == 0
        assert not st.params.any() and not st.m.any() and not st.v.any()

    def test_state_round_trip_and_set_state_arguments(self, raw: Raw, shape: ModelShape) -> None:
        st = fresh(shape, step=7)
        assert raw.set(st) == OK
        assert raw.get().equal(st)
        for bad in (State(st.params, st.m, st.v, -1),):
            assert raw.set(bad) == ARGUMENT
        ffi = raw.ffi
        assert raw.lib.emg_set_state(raw.s, ffi.NULL, raw.f32(st.m), raw.f32(st.v), 0) == ARGUMENT
        assert raw.lib.emg_set_state(raw.s, raw.f32(st.params), ffi.NULL, raw.f32(st.v), 0) == ARGUMENT
        assert raw.lib.emg_set_state(raw.s, raw.f32(st.params), raw.f32(st.m), ffi.NULL, 0) == ARGUMENT
        assert raw.lib.emg_set_state(ffi.NULL, raw.f32(st.params), raw.f32(st.m), raw.f32(st.v), 0) == ARGUMENT
        assert raw.get().equal(st)

    # ---- bad input changes nothing -----------------------------------------------------------------------
    @pytest.mark.parametrize("case", BAD_BATCHES)
    def test_bad_batch_is_an_argument_error(self, raw: Raw, shape: ModelShape, case: str) -> None:
        st = fresh(shape)
        raw.set(st)
        tokens, lengths = batches(1, SESSION_BATCH + 1, seed=3)
        t, ln, batch = _break(case, tokens[0], lengths[0], shape)
        status, _, _ = raw.loss(t, ln, batch=batch)
        assert status == ARGUMENT
        lrs, losses = np.full(1, 1e-2, np.float32), np.zeros(1, np.float32)
        t3 = None if t is None else t[None]
        l3 = None if ln is None else ln[None]
        assert raw.train(t3, l3, lrs, losses, batch=batch) == ARGUMENT
        assert raw.get().equal(st)

    @pytest.mark.parametrize("case", ("length_over_context", "token_vocab_live", "token_vocab_padding"))
    def test_batch_rule_follows_the_session_shape(self, lib: Any, shape: ModelShape, case: str) -> None:
        """At another vocabulary and context, the limits move with them: the longest row and the last token
        are accepted, one more is refused."""
        other = ModelShape(shape.d_model, shape.n_heads, **OTHER_SHAPE)
        if not lib.emg_supports(shape_of(other)):
            pytest.fail(f"{self.backend_name} does not support {other.describe()}")
        raw = self.open(lib, other)
        try:
            st = fresh(other)
            raw.set(st)
            tokens, lengths = batches(1, SESSION_BATCH + 1, seed=4, shape=other)
            tokens[0, 1, :], lengths[0, 1] = other.boundary, other.seq_len  # the longest row, the last token
            status, loss, _ = raw.loss(tokens[0], lengths[0], batch=2)
            assert status == OK and np.isfinite(loss)
            t, ln, batch = _break(case, tokens[0], lengths[0], other)
            assert raw.loss(t, ln, batch=batch)[0] == ARGUMENT
            assert raw.get().equal(st)
        finally:
            raw.close()

    def test_bad_step_late_in_a_call_changes_nothing(self, raw: Raw, shape: ModelShape) -> None:
        st = fresh(shape)
        raw.set(st)
        tokens, lengths = batches(3, 2, seed=5)
        lengths[2, 1] = 1
        assert raw.train(tokens, lengths, np.full(3, 1e-2, np.float32), np.zeros(3, np.float32)) == ARGUMENT
        assert raw.get().equal(st)

    @pytest.mark.parametrize("lr", [float("nan"), float("inf"), float("-inf")])
    def test_non_finite_learning_rate_is_an_argument_error(self, raw: Raw, shape: ModelShape, lr: float) -> None:
        st = fresh(shape)
        raw.set(st)
        tokens, lengths = batches(3, 2, seed=6)
        lrs = np.array([1e-2, 1e-2, lr], np.float32)
        assert raw.train(tokens, lengths, lrs, np.zeros(3, np.float32)) == ARGUMENT
        assert raw.get().equal(st)

    def test_train_steps_arguments(self, raw: Raw, shape: ModelShape) -> None:
        st = fresh(shape)
        raw.set(st)
        tokens, lengths = batches(1, 2, seed=7)
        lrs, losses = np.full(1, 1e-2, np.float32), np.zeros(1, np.float32)
        assert raw.train(tokens, lengths, lrs, losses, n=0) == ARGUMENT
        assert raw.train(tokens, lengths, lrs, losses, n=-1) == ARGUMENT
        assert raw.train(tokens, lengths, None, losses) == ARGUMENT
        assert raw.train(tokens, lengths, lrs, None, n=1) == ARGUMENT
        ffi = raw.ffi
        assert raw.lib.emg_train_steps(ffi.NULL, 1, 2, raw.u8(tokens), raw.u16(lengths), raw.f32(lrs),
                                       raw.f32(losses)) == ARGUMENT
        assert raw.lib.emg_loss_and_grad(raw.s, 2, raw.u8(tokens), raw.u16(lengths), ffi.NULL, ffi.NULL) == ARGUMENT
        assert raw.get().equal(st)

    # ---- the step contract -------------------------------------------------------------------------------
    def test_losses_are_before_each_update_and_steps_are_counted(self, lib: Any, shape: ModelShape) -> None:
        st = fresh(shape, step=5)
        tokens, lengths = batches(3, 2, seed=8)
        lrs = np.full(3, 1e-2, np.float32)
        one, probe = self.open(lib, shape), self.open(lib, shape)
        try:
            one.set(st)
            losses = np.zeros(3, np.float32)
            assert one.train(tokens, lengths, lrs, losses) == OK
            assert one.get().step == st.step + 3
            # the same steps one call at a time, reading each loss with loss_and_grad first
            probe.set(st)
            for i in range(3):
                status, loss, _ = probe.loss(tokens[i], lengths[i], grads=False)
                assert status == OK
                assert loss == pytest.approx(float(losses[i]), rel=1e-6)
                chunk = np.zeros(1, np.float32)
                assert probe.train(tokens[i : i + 1], lengths[i : i + 1], lrs[i : i + 1], chunk) == OK
                assert chunk[0] == losses[i]
            # chunking changes nothing: every update of every call was applied
            assert probe.get().equal(one.get())
        finally:
            one.close()
            probe.close()

    def test_loss_and_grad_leaves_the_state(self, raw: Raw, shape: ModelShape) -> None:
        st = fresh(shape)
        raw.set(st)
        tokens, lengths = batches(1, 2, seed=9)
        status, loss, grads = raw.loss(tokens[0], lengths[0])
        assert status == OK and np.isfinite(loss) and grads is not None and np.isfinite(grads).all()
        assert raw.get().equal(st)

    # ---- non-finite rules --------------------------------------------------------------------------------
    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_non_finite_loss_stops_before_the_update(self, raw: Raw, shape: ModelShape, bad: float) -> None:
        st = fresh(shape)
        views(shape, st.params)["Wlm"][:] = bad
        raw.set(st)
        tokens, lengths = batches(3, SESSION_BATCH, seed=10)
        losses = np.zeros(3, np.float32)
        assert raw.train(tokens, lengths, np.full(3, 1e-2, np.float32), losses) == NONFINITE
        assert not np.isfinite(losses[0])  # the loss that stopped the call is reported
        assert np.isnan(losses[1:]).all()  # steps that did not run
        assert raw.get().equal(st)
        for grads in (True, False):
            status, _, _ = raw.loss(tokens[0], lengths[0], grads=grads)
            assert status == NONFINITE
        assert raw.get().equal(st)

    def test_non_finite_loss_mid_call_keeps_the_last_finite_step(self, lib: Any, shape: ModelShape) -> None:
        """Step 1 is finite; step 2's batch sums two huge finite embedding rows to Inf (token 5 at position 1).

        Step 1 never reads token 5's row, and its position-1 embeddings are so large that RMSNorm maps them
        to zero, so that step's gradient there is zero and Adam leaves both rows as they were.
        """
        st = fresh(shape)
        emb = views(shape, st.params)
        emb["tok_emb"][5] = 3e38
        emb["pos_emb"][1] = 3e38
        tokens, lengths = batches(3, SESSION_BATCH, seed=11, avoid=5)
        tokens[1, 0, 1] = 5
        lrs = np.full(3, 1e-2, np.float32)
        whole, first = self.open(lib, shape), self.open(lib, shape)
        try:
            whole.set(st)
            losses = np.zeros(3, np.float32)
            assert whole.train(tokens, lengths, lrs, losses) == NONFINITE
            assert np.isfinite(losses[0]) and not np.isfinite(losses[1]) and np.isnan(losses[2])
            first.set(st)
            assert first.train(tokens[:1], lengths[:1], lrs[:1], np.zeros(1, np.float32)) == OK
            after = whole.get()
            assert after.step == st.step + 1
            assert after.equal(first.get())
        finally:
            whole.close()
            first.close()

    @pytest.mark.parametrize("where", ["all", "first", "last"])
    def test_update_that_overflows_is_non_finite(self, raw: Raw, shape: ModelShape, where: str) -> None:
        """Huge first moments with zero second moments overflow the Adam step: caught after the update. One
        parameter alone (the first or the last: on a threaded step, the first and the last thread's share of a
        fused update) must be caught too."""
        st = fresh(shape, step=1000)
        positions: dict[str, slice | int] = {"all": slice(None), "first": 0, "last": -1}
        st.m[positions[where]] = 3e38
        st.v[:] = 0.0
        raw.set(st)
        tokens, lengths = batches(1, SESSION_BATCH, seed=12)
        losses = np.zeros(1, np.float32)
        assert raw.train(tokens, lengths, np.ones(1, np.float32), losses) == NONFINITE
        assert np.isfinite(losses[0])  # the loss was fine; the update was not
        after = raw.get()
        assert after.step == st.step + 1 and not np.isfinite(after.params).all()
        if where != "all":
            assert np.count_nonzero(~np.isfinite(after.params)) == 1

    # ---- the optimiser ---------------------------------------------------------------------------------------
    def test_set_optimizer_refuses_bad_values_and_changes_nothing(self, lib: Any, shape: ModelShape) -> None:
        """Every refused setting leaves the one set before in force: the step afterwards is the step that setting
        alone gives, bit for bit (and a different one from the default's, so a refused value applied would show)."""
        good = OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1, grad_clip=1e-3)
        st = fresh(shape, step=3)
        tokens, lengths = batches(1, SESSION_BATCH, seed=14)
        lrs = np.full(1, 1e-2, np.float32)
        runs: dict[str, State] = {}
        for name in ("default", "good", "probe"):
            raw = self.open(lib, shape)
            try:
                raw.set(st)
                if name != "default":
                    assert raw.set_optimizer(good) == OK
                if name == "probe":
                    for bad in BAD_OPTIMIZERS:
                        assert raw.set_optimizer(bad) == ARGUMENT, bad
                    assert raw.set_optimizer(None) == ARGUMENT
                    assert lib.emg_set_optimizer(raw.ffi.NULL, optimizer_of(good)) == ARGUMENT
                    assert raw.get().equal(st)  # setting the optimiser never touches the state
                assert raw.train(tokens, lengths, lrs, np.zeros(1, np.float32)) == OK
                runs[name] = raw.get()
            finally:
                raw.close()
        assert runs["probe"].equal(runs["good"])
        assert not np.array_equal(runs["good"].params, runs["default"].params)

    def _one_step(self, lib: Any, shape: ModelShape, settings: dict[str, float] | None,
                  ) -> tuple[State, State, np.ndarray, OptimizerSettings | None]:
        """(state before, state after, gradient, settings as applied) of one step on a fixed batch; with
        settings None the session keeps the optimiser it starts with. grad_clip is taken relative to the norm
        of the gradient loss_and_grad gives on that batch and state."""
        st = fresh(shape, step=3)
        tokens, lengths = batches(1, SESSION_BATCH, seed=15)
        raw = self.open(lib, shape)
        try:
            raw.set(st)
            status, _, grads = raw.loss(tokens[0], lengths[0])
            assert status == OK and grads is not None
            opt = None
            if settings is not None:
                settings = dict(settings)
                if "grad_clip" in settings:
                    settings["grad_clip"] *= float(np.linalg.norm(grads.astype(np.float64)))
                opt = as_float32(OptimizerSettings(**settings))
                assert raw.set_optimizer(opt) == OK
            assert raw.train(tokens, lengths, np.full(1, STEP_LR, np.float32), np.zeros(1, np.float32)) == OK
            return st, raw.get(), grads, opt
        finally:
            raw.close()

    def test_default_settings_and_idle_clipping_change_no_bit(self, lib: Any, shape: ModelShape) -> None:
        """The defaults set explicitly, and clipping above the gradient's norm, train what a session that never
        called emg_set_optimizer trains (the header: a factor of exactly 1)."""
        _, want, _, _ = self._one_step(lib, shape, None)
        for settings in (dataclasses.asdict(DEFAULT_OPTIMIZER), {"grad_clip": 1.01}, {"grad_clip": 1e3}):
            assert self._one_step(lib, shape, settings)[1].equal(want), settings

    @pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
    def test_optimizer_step_matches_the_reference(self, lib: Any, shape: ModelShape, case: str) -> None:
        """One AdamW step from a state with history against optim.adam_update in float64 on the library's own
        gradient (loss_and_grad on the same batch and state) and its float32 settings.

        Bound per element: 2^-22 |p| (the float32 parameter rounded once or twice: 2 ulps) plus 1e-5 times the
        step's scale lr (b1 |m| + (1 - b1) |g|) / bc1 / (sqrt(v_hat) + eps) (the moment's terms before any
        cancellation between them, with the unclipped g: ~170 float32 roundings of it, for the dozen operations
        of the update, the clipping factor and the reciprocal bias corrections some libraries use). Measured on
        the x86 libraries (1-3 threads) and example_c: at most 0.45 of the bound, nearly all of it the parameter's
        own rounding (half an ulp; about one with decay, whose factor is a float32 too); beyond half an ulp, at
        most 2e-7 of the step's scale without decay and 2e-4 with it."""
        st, after, grads, opt = self._one_step(lib, shape, OPTIMIZER_CASES[case])
        assert opt is not None and after.step == st.step + 1
        p, m, v = (a.astype(np.float64) for a in (st.params, st.m, st.v))
        g = grads.astype(np.float64)
        lr = float(np.float32(STEP_LR))
        adam_update(p, g, m, v, st.step + 1, lr, opt)
        bc1, bc2 = 1.0 - opt.beta1 ** (st.step + 1), 1.0 - opt.beta2 ** (st.step + 1)
        moment = opt.beta1 * np.abs(st.m) + (1.0 - opt.beta1) * np.abs(g)
        step_scale = lr * moment / bc1 / (np.sqrt(v / bc2) + opt.eps)
        err = np.abs(after.params.astype(np.float64) - p)
        bound = 2.0**-22 * np.abs(p) + 1e-5 * step_scale
        assert (err <= bound).all(), f"worst element at {float(np.max(err / bound)):.3g} of its bound"
