"""The C libraries through their ABI: gradients at the batch extremes, argument checks done in C itself,
arrays refused by the cffi layer before C, non-finite detection, the vectorised exp and the FMA peak."""

from __future__ import annotations

import numpy as np
import pytest
from eemicrogpt_backend_x86.libs import extras
from eemicrogpt_backend_x86.plugin import eemicrogpt_fp32_peak_gflops
from reference64 import clear_inputs, random_batch, rel_rms

from eemicrogpt_core.backend import TrainState
from eemicrogpt_core.model import MAX_SEQ, ModelShape, init_params
from eemicrogpt_core.native import NativeBackendError, NativeSession, _ffi, load_library

OK, ARGUMENT, UNSUPPORTED, NONFINITE = 0, 1, 2, 4


@pytest.mark.parametrize(("d_model", "n_heads", "batch"), [(16, 4, 1), (16, 4, 256), (64, 8, 3), (128, 4, 256)])
def test_gradients_at_batch_extremes(lib_path: str, d_model: int, n_heads: int, batch: int) -> None:
    shape = ModelShape(d_model, n_heads)
    ref = clear_inputs(shape, batch)
    session = NativeSession(lib_path, shape, 256)
    session.set_state(TrainState.fresh(ref.params))
    loss, grads = session.loss_and_grads(ref.tokens, ref.lengths)
    assert grads is not None
    assert abs(loss - ref.loss) / ref.loss < 1e-6
    assert rel_rms(grads, ref.grads) < 1e-5


def test_supports_and_create_reject_unsupported_shapes(lib_path: str) -> None:
    ffi, lib = _ffi(), load_library(lib_path)
    for d, h in [(16, 4), (32, 4), (32, 8), (64, 4), (64, 8), (128, 4), (128, 8)]:
        assert lib.emg_supports(d, h) == 1
    out = ffi.new("emg_session **")
    for d, h in [(16, 8), (48, 4), (256, 4), (64, 2), (0, 4)]:
        assert lib.emg_supports(d, h) == 0
        assert lib.emg_create(d, h, 16, out) == UNSUPPORTED
        assert out[0] == ffi.NULL
    assert lib.emg_create(16, 4, 257, out) == UNSUPPORTED
    assert lib.emg_create(16, 4, 0, out) == ARGUMENT
    assert lib.emg_create(16, 4, 16, ffi.NULL) == ARGUMENT


class _Raw:
    """A session driven straight through the cffi lib, bypassing every Python-side check."""

    def __init__(self, lib_path: str, max_batch: int = 4) -> None:
        self.ffi, self.lib = _ffi(), load_library(lib_path)
        self.shape = ModelShape(16, 4)
        out = self.ffi.new("emg_session **")
        assert self.lib.emg_create(16, 4, max_batch, out) == OK
        self.s = out[0]
        self.params = init_params(self.shape, 3)
        zeros = np.zeros_like(self.params)
        assert self.lib.emg_set_state(self.s, self.f(self.params), self.f(zeros), self.f(zeros), 0) == OK

    def f(self, a: np.ndarray):
        return self.ffi.cast("float *", self.ffi.from_buffer(a))

    def u8(self, a: np.ndarray):
        return self.ffi.cast("uint8_t *", self.ffi.from_buffer(a))

    def train(self, tokens: np.ndarray, lengths: np.ndarray, n: int, batch: int) -> int:
        lrs, losses = np.full(max(n, 1), 0.01, np.float32), np.zeros(max(n, 1), np.float32)
        return self.lib.emg_train_steps(self.s, n, batch, self.u8(tokens), self.u8(lengths), self.f(lrs),
                                        self.f(losses))

    def state(self) -> tuple[np.ndarray, int]:
        p, m, v = (np.empty_like(self.params) for _ in range(3))
        step = self.ffi.new("int64_t *")
        assert self.lib.emg_get_state(self.s, self.f(p), self.f(m), self.f(v), step) == OK
        return p, int(step[0])

    def close(self) -> None:
        self.lib.emg_destroy(self.s)


def _good(n: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    tokens, lengths = random_batch(np.random.default_rng(0), n * batch)
    return tokens.reshape(n, batch, MAX_SEQ).copy(), lengths.reshape(n, batch).copy()


def _bad(case: str) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """A 2-step run of batch 4 with one defect: (tokens, lengths, n_steps, batch, index of the bad step)."""
    tokens, lengths = _good(2, 4)
    n, batch, bad = 2, 4, 0
    if case == "token_27":
        tokens[1, 2, 1], bad = 27, 1  # in the second step: the whole call must be refused up front
    elif case == "token_255_padding":
        tokens[0, 0, MAX_SEQ - 1], lengths[0, 0] = 255, 3
    elif case == "length_1":
        lengths[1, 3], bad = 1, 1
    elif case == "length_17":
        lengths[0, 0] = 17
    elif case == "batch_0":
        batch = 0
    elif case == "batch_over_max":
        tokens, lengths = _good(2, 5)
        batch = 5
    elif case == "n_0":
        n = 0
    return tokens, lengths, n, batch, bad


@pytest.mark.parametrize(
    "case", ["token_27", "token_255_padding", "length_1", "length_17", "batch_0", "batch_over_max", "n_0"]
)
def test_c_rejects_bad_batches_without_changing_state(lib_path: str, case: str) -> None:
    raw = _Raw(lib_path, max_batch=4)
    try:
        tokens, lengths, n, batch, bad = _bad(case)
        assert raw.train(tokens, lengths, n, batch) == ARGUMENT
        params, step = raw.state()
        np.testing.assert_array_equal(params, raw.params)
        assert step == 0
        if case != "n_0":  # emg_loss_and_grad checks the same batch properties
            loss = raw.ffi.new("float *")
            t, ln = tokens[bad].copy(), lengths[bad].copy()
            status = raw.lib.emg_loss_and_grad(raw.s, batch, raw.u8(t), raw.u8(ln), loss, raw.ffi.NULL)
            assert status == ARGUMENT
    finally:
        raw.close()


def test_c_rejects_null_pointers(lib_path: str) -> None:
    raw = _Raw(lib_path)
    try:
        ffi, lib = raw.ffi, raw.lib
        tokens, lengths = _good(1, 2)
        lrs, losses = np.full(1, 0.01, np.float32), np.zeros(1, np.float32)
        t, ln, lr, out = raw.u8(tokens), raw.u8(lengths), raw.f(lrs), raw.f(losses)
        assert lib.emg_train_steps(raw.s, 1, 2, ffi.NULL, ln, lr, out) == ARGUMENT
        assert lib.emg_train_steps(raw.s, 1, 2, t, ln, ffi.NULL, out) == ARGUMENT
        assert lib.emg_train_steps(raw.s, 1, 2, t, ln, lr, ffi.NULL) == ARGUMENT
        assert lib.emg_train_steps(ffi.NULL, 1, 2, t, ln, lr, out) == ARGUMENT
        assert lib.emg_loss_and_grad(raw.s, 2, t, ln, ffi.NULL, ffi.NULL) == ARGUMENT
        assert lib.emg_set_state(raw.s, ffi.NULL, raw.f(lrs), raw.f(lrs), 0) == ARGUMENT
        p = np.zeros_like(raw.params)
        assert lib.emg_set_state(raw.s, raw.f(p), raw.f(p), raw.f(p), -1) == ARGUMENT
    finally:
        raw.close()


def test_cffi_layer_refuses_malformed_arrays(lib_path: str) -> None:
    session = NativeSession(lib_path, ModelShape(16, 4), 4)
    tokens, lengths = _good(2, 4)
    lrs = np.full(2, 0.01, np.float32)
    with pytest.raises(ValueError, match="tokens must be uint8"):
        session.train_steps(tokens.astype(np.int64), lengths, lrs)
    with pytest.raises(ValueError, match="C-contiguous"):
        session.train_steps(np.asfortranarray(tokens), lengths, lrs)
    with pytest.raises(ValueError, match="lrs must be float32"):
        session.train_steps(tokens, lengths, lrs.astype(np.float64))
    with pytest.raises(ValueError, match="batch 5 is outside"):
        t5, l5 = _good(2, 5)
        session.train_steps(t5, l5, lrs)
    session.close()


def test_nonfinite_loss_is_reported_and_state_kept(lib_path: str) -> None:
    shape = ModelShape(16, 4)
    session = NativeSession(lib_path, shape, 4)
    params = init_params(shape, 1)
    params[shape.offsets["Wlm"]] = np.inf
    session.set_state(TrainState.fresh(params))
    tokens, lengths = _good(1, 4)
    with pytest.raises(NativeBackendError, match="non-finite") as info:
        session.train_steps(tokens, lengths, np.full(1, 0.01, np.float32))
    assert info.value.status == NONFINITE
    after = session.get_state()
    assert after.step == 0
    np.testing.assert_array_equal(after.params, params)
    session.close()


def test_vector_exp_is_accurate_to_1_5e7(variant: str) -> None:
    # measured max 7.4e-8 (about 1 ulp) on [-87, 10]
    ffi, lib = extras(variant)
    x = np.concatenate([np.linspace(-87.0, 10.0, 200_000), np.linspace(-1.0, 1.0, 4096)]).astype(np.float32)
    x = x[: x.size // 16 * 16].copy()
    y = np.empty_like(x)
    lib.emg_x86_exp(ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(y)), x.size)
    want = np.exp(x.astype(np.float64))
    rel = np.abs(y - want) / want
    assert rel.max() < 1.5e-7, f"max relative error {rel.max():.2e} at x = {x[np.argmax(rel)]}"
    masked = np.array([-np.inf, -1e30, -100.0, -89.0] * 4, np.float32)
    out = np.empty_like(masked)
    lib.emg_x86_exp(ffi.cast("float *", ffi.from_buffer(masked)), ffi.cast("float *", ffi.from_buffer(out)), 16)
    np.testing.assert_array_equal(out, 0.0)


def test_fp32_peak_hook_measures_and_rejects_bad_seconds() -> None:
    gflops = eemicrogpt_fp32_peak_gflops(0.05)
    assert gflops is not None and 1.0 < gflops < 10_000.0
    with pytest.raises(ValueError, match="seconds must be positive"):
        eemicrogpt_fp32_peak_gflops(0.0)
