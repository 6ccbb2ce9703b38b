"""Checks on what a backend session returns, before the trainer uses, reports or saves any of it.

validate.py checks what goes into a backend; this module checks what comes out. A plugin is third-party
code: a state of the wrong length, losses of the wrong count or shape, a step that is not an integer or not
the step the trainer expects are each one line naming the backend and what was wrong (BackendOutputError),
never a traceback and never a checkpoint. Non-finite values are not this module's business: they mean the
run diverged, which the trainer reports (it locates the step), except that `nonfinite_part` tells it so.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..base.errors import BackendOutputError
from ..model.shape import ModelShape
from .backend import STATE_ARRAYS, BackendSession, TrainState


def _kind(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} {value.dtype}"
    return type(value).__name__


def _is_integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def checked_losses(backend: str, raw: object, n: int) -> np.ndarray:
    """train_steps' result: a 1-D floating-point array of exactly n losses, returned as float32."""
    if not isinstance(raw, np.ndarray) or raw.dtype.kind != "f" or raw.shape != (n,):
        raise BackendOutputError(f"backend '{backend}' returned {_kind(raw)} from train_steps for {n} steps; "
                                 f"expected a float array of {n} losses, one per step")
    return raw.astype(np.float32, copy=False)


def checked_loss(backend: str, result: object, n_params: int, want_grads: bool) -> tuple[float, np.ndarray | None]:
    """loss_and_grads' result: (a real number, a gradient of n_params floats or None when not wanted)."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise BackendOutputError(f"backend '{backend}' returned {_kind(result)} from loss_and_grads; expected a "
                                 "(loss, gradient) pair")
    loss, grads = result
    if isinstance(loss, np.ndarray) and loss.shape == ():
        loss = loss[()]
    if not isinstance(loss, numbers.Real) or isinstance(loss, (bool, np.bool_)):
        raise BackendOutputError(f"backend '{backend}' returned a loss of {_kind(loss)} from loss_and_grads; "
                                 "expected a number")
    if want_grads and (not isinstance(grads, np.ndarray) or grads.dtype.kind != "f" or grads.shape != (n_params,)):
        raise BackendOutputError(f"backend '{backend}' returned a gradient of {_kind(grads)}; expected "
                                 f"{n_params} floats")
    return float(loss), grads if want_grads else None


def checked_state(backend: str, state: object, n_params: int, dtype: np.dtype, step: int | None) -> TrainState:
    """get_state's result: a TrainState of three 1-D arrays of n_params values in the session's dtype, adam_v
    not negative, and (when known) the step the trainer counted. Returned as copies the backend cannot alias."""
    where = f"backend '{backend}' returned a bad state from get_state"
    if not isinstance(state, TrainState):
        raise BackendOutputError(f"{where}: {_kind(state)}, not a TrainState")
    arrays = {}
    for name in STATE_ARRAYS:
        array = getattr(state, name)
        if not isinstance(array, np.ndarray) or array.shape != (n_params,) or array.dtype != dtype:
            raise BackendOutputError(f"{where}: {name} is {_kind(array)}, expected ({n_params},) {dtype}")
        arrays[name] = array.copy()
    if not _is_integer(state.step):
        raise BackendOutputError(f"{where}: step is {_kind(state.step)} {state.step!r}, not an integer")
    if step is not None and int(state.step) != step:
        raise BackendOutputError(f"{where}: step {int(state.step)}, but {step} steps were taken")
    if np.any(arrays["adam_v"] < 0):  # NaN compares false: non-finite values are the trainer's to report
        raise BackendOutputError(f"{where}: adam_v holds negative values (it is a mean of squares)")
    return TrainState(arrays["params"], arrays["adam_m"], arrays["adam_v"], int(state.step))


def nonfinite_part(state: TrainState) -> str | None:
    """The first state array holding NaN or infinity (a state never to be saved), or None."""
    return next((name for name in STATE_ARRAYS if not np.all(np.isfinite(getattr(state, name)))), None)


class CheckedSession:
    """A session whose every output is checked (see the module docstring); the step it should be at is counted
    from set_state and the train_steps calls that returned, and is unknown after one that raised."""

    def __init__(self, inner: BackendSession, shape: ModelShape, dtype: str, backend: str) -> None:
        self.inner, self.backend = inner, backend
        self.n_params, self.dtype = shape.n_params, np.dtype(dtype)
        self._step: int | None = None

    def set_state(self, state: TrainState) -> None:
        self._step = None
        self.inner.set_state(state)
        self._step = int(state.step)

    def get_state(self) -> TrainState:
        return checked_state(self.backend, self.inner.get_state(), self.n_params, self.dtype, self._step)

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        before, self._step = self._step, None
        losses = checked_losses(self.backend, self.inner.train_steps(tokens, lengths, lrs), len(lrs))
        self._step = None if before is None else before + len(lrs)
        return losses

    def loss_and_grads(self, tokens: np.ndarray, lengths: np.ndarray,
                       want_grads: bool = True) -> tuple[float, np.ndarray | None]:
        result: Any = self.inner.loss_and_grads(tokens, lengths, want_grads)
        return checked_loss(self.backend, result, self.n_params, want_grads)

    def close(self) -> None:
        self.inner.close()
