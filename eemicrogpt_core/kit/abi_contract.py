"""The native ABI contract as a pytest class: every native backend must answer every fault the same way.

A native backend's tests subclass it with two lines:

    class TestMyAbi(NativeAbiContract):
        backend_name = "mybackend"
        def library_path(self): return find_library(PACKAGE_DIR, "_mylib")

The checks call the library through the core's own loader (native.load_library, cffi ABI mode) on the
smallest shape it supports, and assert the status codes and the state afterwards (bit for bit) for bad
arguments and batches, non-finite learning rates, losses and updates, and the step/loss bookkeeping of
emg_train_steps. The rules themselves live in include/emg_backend.h; a backend built on it passes by
construction, and one that is not must match it. Unavailable backends are skipped (or fail when
EEMICROGPT_REQUIRE_BACKENDS names them), as in the conformance kit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ..backends.native import ABI_VERSION, STATUS, _ffi, load_library
from ..base.abi import MAX_CONTEXT, MAX_LAYERS, MAX_NATIVE_BATCH, MAX_VOCAB, MIN_VOCAB
from ..model.shape import NAMES_VOCAB, ModelShape, init_params, views
from .conformance import _entry, _unusable

OK, ARGUMENT, UNSUPPORTED, NOMEM, NONFINITE = (STATUS[name] for name in (
    "EMG_OK", "EMG_ERR_ARGUMENT", "EMG_ERR_UNSUPPORTED", "EMG_ERR_NOMEM", "EMG_ERR_NONFINITE"))
# Shapes tried in order (one layer, the names' vocabulary, context 16); the first one the library supports
# is the one under test.
CANDIDATE_SHAPES = ((16, 4), (32, 4), (64, 4), (64, 8), (128, 4), (128, 8))
# (d_model, n_heads, n_layers, vocab, context) that ModelShape refuses, each breaking one rule.
INVALID_SHAPES = ((16, 3, 1, 27, 16), (16, 8, 1, 27, 16), (0, 4, 1, 27, 16), (-16, 4, 1, 27, 16), (16, 0, 1, 27, 16),
                  (16, -4, 1, 27, 16), (64, 4, 0, 27, 16), (64, 4, MAX_LAYERS + 1, 27, 16),
                  (64, 4, 1, MIN_VOCAB - 1, 16), (64, 4, 1, MAX_VOCAB + 1, 16), (64, 4, 1, 27, 0),
                  (64, 4, 1, 27, MAX_CONTEXT + 1))
# A second shape, to show the batch rule follows the session's vocabulary and context (tried at each width).
OTHER_SHAPE = {"n_layers": 2, "vocab": 40, "context": 24}
# The non-finite rules run on batches this large: a threaded session then really splits the step (the x86
# backend gives a chunk at least 4 sequences; a smaller batch runs inline and would test nothing threaded).
SESSION_BATCH = 16


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
        return self.lib.emg_train_steps(self.s, n, batch, self.u8(tokens), self.u8(lengths), self.f32(lrs),
                                        self.f32(losses))

    def loss(self, tokens: np.ndarray | None, lengths: np.ndarray | None, grads: bool = True,
             batch: int | None = None) -> tuple[int, float, np.ndarray | None]:
        batch = batch if batch is not None else (tokens.shape[0] if tokens is not None else 2)
        loss = self.ffi.new("float *")
        g = np.empty(self.shape.n_params, np.float32) if grads else None
        status = self.lib.emg_loss_and_grad(self.s, batch, self.u8(tokens), self.u8(lengths), loss, self.f32(g))
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
    lengths = rng.integers(3, seq + 1, size=(n, batch)).astype(np.uint8)
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


BAD_BATCHES = ("batch_0", "batch_over_max", "length_1", "length_over_context", "token_vocab_live",
               "token_vocab_padding", "null_tokens", "null_lengths")


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
        assert raw.lib.emg_train_steps(ffi.NULL, 1, 2, raw.u8(tokens), raw.u8(lengths), raw.f32(lrs),
                                       raw.f32(losses)) == ARGUMENT
        assert raw.lib.emg_loss_and_grad(raw.s, 2, raw.u8(tokens), raw.u8(lengths), ffi.NULL, ffi.NULL) == ARGUMENT
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
