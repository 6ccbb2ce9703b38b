"""The session's optimiser in the fused threaded step (threads.c emg_x86_reduce, adam.h): clipping's norm over
parts fixed by the parameter count, so every thread count trains the same bits with clipping on too; weight
decay and the betas in the same pass. The comparison of one step with optim.adam_update and the refused
settings are the ABI kit's (test_abi_contract.py, on one thread and threaded)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from reference64 import random_batch

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.native import NativeSession
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, clip_scale
from eemicrogpt_core.model.shape import ModelShape, init_params

# Batches of 2, 4 and 1 chunks. Clipping at 0.05 engages on every step of these runs (the gradients' norms,
# measured before each step: 0.41-0.58 at d32 batch 24, 0.38-0.61 at d48 batch 130, 0.73-1.6 at d16 batch 5),
# with decay and other betas in the same update.
RUNS = [(ModelShape(32, 4, 2, 40, 24), 24), (ModelShape(48, 4, 1, 27, 16), 130), (ModelShape(16, 4), 5)]
CLIPPED = OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-7, weight_decay=0.1, grad_clip=0.05)


def _run(lib_path: str, shape: ModelShape, threads: int, steps: int, batch: int,
         opt: OptimizerSettings) -> tuple[np.ndarray, TrainState]:
    tokens, lengths = random_batch(np.random.default_rng(7), shape, steps * batch)
    tokens, lengths = tokens.reshape(steps, batch, shape.seq_len).copy(), lengths.reshape(steps, batch).copy()
    session = NativeSession(lib_path, shape, batch)
    try:
        session.set_state(TrainState.fresh(init_params(shape, 3)))
        assert session.set_threads(threads) == threads
        session.set_optimizer(opt)
        losses = session.train_steps(tokens, lengths, np.full(steps, 0.01, np.float32))
        return losses, session.get_state()
    finally:
        session.close()


@pytest.mark.parametrize(("shape", "batch"), RUNS)
def test_clipping_gives_bit_identical_runs_on_any_thread_count(lib_path: str, shape: ModelShape, batch: int) -> None:
    """2, 3 and 7 threads split the norm's 64 parts differently (7 threads: 9 or 10 parts each) and must add
    them in the same order; batch 5 is one chunk (the step runs inline whatever the thread count).

    What this catches: a norm that misses other threads' parts, or reads them before they are written, moves
    the factor (a build taking only each thread's own parts failed here). What it hardly can: a thread-count
    dependent order of the double additions moves the norm by ~1e-16 and the float32 factor only when it lies
    that close to a rounding boundary (a build summing one part per thread passed); that order is fixed by
    construction (EMG_X86_NORM_PARTS, threads.h)."""
    steps = 4 if batch > 100 else 12
    losses_1, state_1 = _run(lib_path, shape, 1, steps, batch, CLIPPED)
    for threads in (2, 3, 7):
        losses, state = _run(lib_path, shape, threads, steps, batch, CLIPPED)
        assert np.array_equal(losses, losses_1), f"{threads} threads"
        for name in ("params", "adam_m", "adam_v"):
            assert np.array_equal(getattr(state, name), getattr(state_1, name)), (threads, name)
    # and the clipping did engage: without it the same run ends elsewhere
    unclipped = _run(lib_path, shape, 1, steps, batch, dataclasses.replace(CLIPPED, grad_clip=0.0))
    assert not np.array_equal(unclipped[1].params, state_1.params)


def test_clipping_engages_on_the_tested_runs(lib_path: str) -> None:
    """The premise of CLIPPED, on each run's first batch: the norm is far above 0.05, so the factor is below 1."""
    for shape, batch in RUNS:
        tokens, lengths = random_batch(np.random.default_rng(7), shape, batch)
        session = NativeSession(lib_path, shape, batch)
        try:
            session.set_state(TrainState.fresh(init_params(shape, 3)))
            _, grads = session.loss_and_grads(tokens, lengths)
        finally:
            session.close()
        assert grads is not None and clip_scale(grads, CLIPPED.grad_clip) < 0.25


def test_setting_the_defaults_keeps_the_threaded_step(lib_path: str) -> None:
    """emg_set_optimizer with the defaults (after other settings) trains what a session that never called it
    trains, threaded: the fused step's default loop is the original one."""
    shape, batch, steps = ModelShape(32, 4), 16, 6
    want = _run(lib_path, shape, 2, steps, batch, DEFAULT_OPTIMIZER)
    tokens, lengths = random_batch(np.random.default_rng(7), shape, steps * batch)
    tokens, lengths = tokens.reshape(steps, batch, shape.seq_len).copy(), lengths.reshape(steps, batch).copy()
    session = NativeSession(lib_path, shape, batch)
    try:
        session.set_state(TrainState.fresh(init_params(shape, 3)))
        session.set_threads(2)
        session.set_optimizer(CLIPPED)
        session.set_optimizer(DEFAULT_OPTIMIZER)
        losses = session.train_steps(tokens, lengths, np.full(steps, 0.01, np.float32))
        state = session.get_state()
    finally:
        session.close()
    assert np.array_equal(losses, want[0]) and np.array_equal(state.params, want[1].params)
