"""A step split across threads (emg_set_threads): the same gradients as one thread, bit-identical runs for a
given thread count, the rule for how many chunks a batch is split into, chunks left empty when there are
fewer chunks than threads and the C argument checks.
The conformance kit on 2 and 3 threads is in test_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest
from reference64 import clear_inputs, random_batch, rel_rms

from eemicrogpt_core.abi_testing import ARGUMENT, UNSUPPORTED, raw_shape
from eemicrogpt_core.backend import TrainState
from eemicrogpt_core.errors import NonFiniteError
from eemicrogpt_core.model import ModelShape, init_params
from eemicrogpt_core.native import NativeSession, _ffi, load_library


def _session(lib_path: str, shape: ModelShape, threads: int, params: np.ndarray, max_batch: int = 256):
    session = NativeSession(lib_path, shape, max_batch)
    session.set_state(TrainState.fresh(params))
    assert session.set_threads(threads) == threads
    return session


@pytest.mark.parametrize("threads", [2, 3, 7])
@pytest.mark.parametrize(("shape", "batch"), [(ModelShape(16, 4), 1), (ModelShape(16, 4), 5), (ModelShape(64, 8), 16),
                                              (ModelShape(128, 4), 256), (ModelShape(48, 3, 3, 64, 64), 40)])
def test_threaded_gradients_match_float64(lib_path: str, threads: int, shape: ModelShape, batch: int) -> None:
    """Batch 1 and 5 run as one chunk, 16 on 7 threads leaves 3 of 7 chunks empty (MIN_SEQS_PER_CHUNK = 4);
    256 gives every thread several hundred rows; 3 layers at context 64 give every thread's own activations
    several blocks."""
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


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_same_threads_give_bit_identical_runs(lib_path: str, threads: int) -> None:
    shape = ModelShape(32, 4, 2, 40, 24)
    losses_a, state_a = _run(lib_path, shape, threads, 30, 24)
    losses_b, state_b = _run(lib_path, shape, threads, 30, 24)
    assert np.array_equal(losses_a, losses_b)
    assert np.array_equal(state_a.params, state_b.params)
    assert np.array_equal(state_a.adam_v, state_b.adam_v)
    if threads > 1:  # another thread count sums in another order: close, not necessarily equal
        losses_1, _ = _run(lib_path, shape, 1, 30, 24)
        assert np.max(np.abs(losses_1 - losses_a)) < 1e-4


@pytest.mark.parametrize(("batch", "threads", "same_as"), [(7, 2, 1), (4, 3, 1), (8, 3, 2), (12, 7, 3)])
def test_a_batch_is_split_into_min_threads_and_batch_over_4_chunks(lib_path: str, batch: int, threads: int,
                                                                   same_as: int) -> None:
    """threads.h's rule: min(threads, batch // 4) chunks, at least 1. So `threads` threads give bit-identical
    results to `same_as` threads, while the `same_as + 1` split differs (in the last bits) when it exists."""
    shape = ModelShape(32, 4)
    losses_a, state_a = _run(lib_path, shape, threads, 12, batch)
    losses_b, state_b = _run(lib_path, shape, same_as, 12, batch)
    assert np.array_equal(losses_a, losses_b)
    assert np.array_equal(state_a.params, state_b.params)
    if same_as > 1:
        _, state_1 = _run(lib_path, shape, 1, 12, batch)
        assert not np.array_equal(state_1.params, state_a.params)  # a split that sums in another order


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
