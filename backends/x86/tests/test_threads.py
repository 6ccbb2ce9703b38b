"""A step split across threads (emg_set_threads): the same gradients as the float64 reference, bit-identical
runs whatever the thread count (the chunks are fixed by the batch size alone, threads.h), also when the count
changes between calls, participants left without a chunk when there are more threads than chunks, and the
C argument checks.
The conformance kit on 2 and 3 threads is in test_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest
from reference64 import clear_inputs, random_batch, rel_rms

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import NativeSession, _ffi, load_library
from eemicrogpt_core.base.errors import NonFiniteError
from eemicrogpt_core.kit.abi_contract import ARGUMENT, UNSUPPORTED, raw_shape
from eemicrogpt_core.model.shape import ModelShape, init_params


def _session(lib_path: str, shape: ModelShape, threads: int, params: np.ndarray, max_batch: int = 256):
    session = NativeSession(lib_path, shape, max_batch)
    session.set_state(TrainState.fresh(params))
    assert session.set_threads(threads) == threads
    return session


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize(("shape", "batch"), [(ModelShape(16, 4), 1), (ModelShape(16, 4), 5), (ModelShape(64, 8), 16),
                                              (ModelShape(128, 4), 256), (ModelShape(48, 3, 3, 64, 64), 40),
                                              (ModelShape(272, 4), 16)])
def test_threaded_gradients_match_float64(lib_path: str, threads: int, shape: ModelShape, batch: int) -> None:
    """Batch 1 and 5 run as one chunk, 16 as two (so 7 threads leave 5 participants without a chunk; one
    thread folds the second chunk's weight gradients into the first's), 256 as four with several hundred rows
    each; 3 layers at context 64 give every chunk several blocks. d272 runs the run-time-width step, whose one
    thread folds the second chunk in tile by tile (gemm_tn_strips, gemm_tn_bf16_fold2_epi) and whose two
    threads run that pass together."""
    ref = clear_inputs(shape, batch)
    session = _session(lib_path, shape, threads, ref.params)
    loss, grads = session.loss_and_grads(ref.tokens, ref.lengths)
    loss_only, none = session.loss_and_grads(ref.tokens, ref.lengths, want_grads=False)
    session.close()
    assert grads is not None and none is None
    assert loss_only == loss
    assert abs(loss - ref.loss) / ref.loss < 1e-6
    assert rel_rms(grads, ref.grads) < 1e-5


def _run(lib_path: str, shape: ModelShape, threads: int, steps: int, batch: int) -> tuple[np.ndarray, TrainState]:
    tokens, lengths = random_batch(np.random.default_rng(5), shape, steps * batch)
    tokens, lengths = tokens.reshape(steps, batch, shape.seq_len).copy(), lengths.reshape(steps, batch).copy()
    session = _session(lib_path, shape, threads, init_params(shape, 2), max_batch=batch)
    losses = session.train_steps(tokens, lengths, np.full(steps, 0.01, np.float32))
    state = session.get_state()
    session.close()
    return losses, state


@pytest.mark.parametrize(("shape", "batch"), [(ModelShape(32, 4, 2, 40, 24), 7), (ModelShape(32, 4, 2, 40, 24), 24),
                                              (ModelShape(16, 4), 8), (ModelShape(48, 4, 1, 27, 16), 130),
                                              (ModelShape(32, 4, 1, 27, 8), 128), (ModelShape(400, 8, 1, 27, 16), 9),
                                              (ModelShape(288, 6, 2, 65, 24), 8), (ModelShape(32, 4, 2, 27, 256), 9)])
def test_every_thread_count_gives_bit_identical_runs(lib_path: str, shape: ModelShape, batch: int) -> None:
    """Batches of 1, 2 and 4 chunks (threads.h emg_x86_chunks): 1-7 threads train the same bits. A participant
    that runs chunk 0 folds each following one-block chunk into its sum (emg_segment): one thread folds every
    chunk at batch 24 and at batch 128 with context 8 (four chunks of ~130 rows), two threads only the second
    of those four, three none; at batch 130 with context 16 the chunks straddle one block (240 rows), so some
    fold and some do not. Widths 400 and 288 run the run-time-width step (csrc/step_wide.c), where two
    threads run both chunks' one block as one pass together (step_impl.h emg_pass.parts: GEMMs split by
    columns, weight gradients by rows, row-wise work by chunk), width 288 with an LM head of 65 rows split
    unevenly (32 + 33); context 256 blocks of one whole sequence (264 rows), several per chunk."""
    steps = 6 if batch > 100 or shape.d_model > 256 or shape.context > 64 else 20
    losses_1, state_1 = _run(lib_path, shape, 1, steps, batch)
    for threads in (2, 3, 4, 7):
        losses, state = _run(lib_path, shape, threads, steps, batch)
        assert np.array_equal(losses, losses_1), f"{threads} threads"
        assert np.array_equal(state.params, state_1.params), f"{threads} threads"
        assert np.array_equal(state.adam_m, state_1.adam_m) and np.array_equal(state.adam_v, state_1.adam_v)


def test_changing_the_thread_count_between_calls_changes_no_bit(lib_path: str) -> None:
    """What threads: auto relies on: switching counts at chunk boundaries trains what one fixed count trains."""
    shape, batch, steps = ModelShape(32, 4), 16, 12
    tokens, lengths = random_batch(np.random.default_rng(3), shape, steps * batch)
    tokens, lengths = tokens.reshape(steps, batch, shape.seq_len).copy(), lengths.reshape(steps, batch).copy()
    lrs = np.full(steps, 0.01, np.float32)
    fixed = _session(lib_path, shape, 2, init_params(shape, 4), max_batch=batch)
    want = fixed.train_steps(tokens, lengths, lrs)
    want_params = fixed.get_state().params
    fixed.close()
    switching = _session(lib_path, shape, 1, init_params(shape, 4), max_batch=batch)
    got = []
    for i, threads in enumerate((1, 2, 2, 1, 3, 1)):
        switching.set_threads(threads)
        got.append(switching.train_steps(tokens[2 * i : 2 * i + 2], lengths[2 * i : 2 * i + 2], lrs[:2]))
    got_params = switching.get_state().params
    switching.close()
    assert np.array_equal(np.concatenate(got), want)
    assert np.array_equal(got_params, want_params)


def test_thread_count_can_change_mid_session(lib_path: str) -> None:
    shape = ModelShape(16, 4)
    tokens, lengths = random_batch(np.random.default_rng(1), shape, 4 * 8)
    tokens, lengths = tokens.reshape(4, 8, shape.seq_len).copy(), lengths.reshape(4, 8).copy()
    lrs = np.full(1, 0.01, np.float32)
    session = _session(lib_path, shape, 2, init_params(shape, 0), max_batch=8)
    for i, threads in enumerate((2, 1, 4, 4)):
        assert session.set_threads(threads) == threads
        session.train_steps(tokens[i : i + 1], lengths[i : i + 1], lrs)
    assert session.get_state().step == 4
    session.close()


def test_c_checks_the_thread_count(lib_path: str) -> None:
    ffi, lib = _ffi(), load_library(lib_path)
    out = ffi.new("emg_session **")
    assert lib.emg_create(raw_shape(16, 4), 4, out) == 0
    assert lib.emg_set_threads(out[0], 0) == ARGUMENT
    assert lib.emg_set_threads(out[0], -3) == ARGUMENT
    assert lib.emg_set_threads(out[0], 65) == UNSUPPORTED
    assert lib.emg_set_threads(ffi.NULL, 2) == ARGUMENT
    assert lib.emg_set_threads(out[0], 64) == 0  # the maximum starts (and joins) 63 threads
    lib.emg_destroy(out[0])
    session = NativeSession(lib_path, ModelShape(16, 4), 4)
    with pytest.raises(ValueError, match="cannot split a step across 65 threads"):
        session.set_threads(65)
    session.close()


def test_threaded_nonfinite_loss_keeps_state(lib_path: str) -> None:
    shape = ModelShape(16, 4, 2)
    params = init_params(shape, 1)
    params[shape.offsets["Wlm"]] = np.inf
    session = _session(lib_path, shape, 3, params, max_batch=8)
    tokens, lengths = random_batch(np.random.default_rng(0), shape, 8)
    with pytest.raises(NonFiniteError, match="non-finite"):
        session.train_steps(tokens[None], lengths[None], np.full(1, 0.01, np.float32))
    state = session.get_state()
    session.close()
    assert state.step == 0
    assert np.array_equal(state.params, params)
