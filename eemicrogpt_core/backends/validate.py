"""Checks on every array before a backend sees it, so that no backend (least of all C) gets bad input."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..base.abi import LENGTH_DTYPE, TOKEN_DTYPE
from ..base.errors import BackendSelectionError, BatchError
from ..model.optim import OptimizerSettings
from ..model.shape import ModelShape
from .backend import STATE_ARRAYS, BackendSession, OptimizerSession, ThreadedSession, TrainState


def _require_array(value: object, name: str, dtype: type, ndim: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise BatchError(f"{name} must be a numpy array, got {type(value).__name__}")
    if value.dtype != dtype:
        raise BatchError(f"{name} must have dtype {np.dtype(dtype).name}, got {value.dtype}")
    if value.ndim != ndim:
        raise BatchError(f"{name} must have {ndim} dimensions, got shape {value.shape}")
    return value


def validate_batch(tokens: object, lengths: object, shape: ModelShape, *, steps: bool,
                   max_batch: int | None = None) -> int:
    """Check tokens [(n,) B, context + 1] uint8 and lengths [(n,) B] uint16; return the batch size B."""
    lead = 1 if steps else 0
    tokens = _require_array(tokens, "tokens", TOKEN_DTYPE, lead + 2)
    lengths = _require_array(lengths, "lengths", LENGTH_DTYPE, lead + 1)
    seq_len = shape.seq_len
    if tokens.shape[-1] != seq_len:
        raise BatchError(f"tokens must have {seq_len} positions per sequence (context {shape.context} + 1), "
                         f"got shape {tokens.shape}")
    if tokens.shape[:-1] != lengths.shape:
        raise BatchError(f"tokens {tokens.shape} and lengths {lengths.shape} disagree on steps/batch")
    if tokens.size == 0:
        raise BatchError(f"empty batch: tokens shape {tokens.shape}")
    batch = tokens.shape[-2]
    if max_batch is not None and batch > max_batch:
        raise BatchError(f"batch {batch} exceeds the capacity of {max_batch} the backend session was opened with")
    if int(tokens.max()) >= shape.vocab:
        raise BatchError(f"token {int(tokens.max())} is out of range: the vocabulary has {shape.vocab} tokens "
                         f"(0..{shape.vocab - 1})")
    low, high = int(lengths.min()), int(lengths.max())
    if low < 2 or high > seq_len:
        bad = low if low < 2 else high
        raise BatchError(f"sequence length {bad} is outside 2..{seq_len}")
    return batch


def validate_lrs(lrs: object, n: int) -> None:
    lrs = _require_array(lrs, "lrs", np.float32, 1)
    if lrs.shape != (n,):
        raise BatchError(f"lrs must hold one learning rate per step ({n}), got shape {lrs.shape}")
    if not np.all(np.isfinite(lrs)) or np.any(lrs < 0):
        raise BatchError("learning rates must be finite and >= 0")


def validate_state(state: object, shape: ModelShape) -> None:
    if not isinstance(state, TrainState):
        raise BatchError(f"state must be a TrainState, got {type(state).__name__}")
    for name in STATE_ARRAYS:
        array = getattr(state, name)
        if not isinstance(array, np.ndarray) or array.shape != (shape.n_params,):
            got = getattr(array, "shape", type(array).__name__)
            raise BatchError(f"state.{name} must have shape ({shape.n_params},), got {got}")
        if not np.issubdtype(array.dtype, np.floating):
            raise BatchError(f"state.{name} must be floating point, got {array.dtype}")
    if int(state.step) < 0:
        raise BatchError(f"state.step must be >= 0, got {state.step}")


class SessionBusyError(RuntimeError):
    """A session was called while another thread was inside it."""


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _one_call_at_a_time(method: _Method) -> _Method:
    """Refuse (rather than wait or race) a call while another thread is inside this session: native backends
    release the GIL (cffi), and their sessions hold per-session scratch buffers that two calls would share."""

    @functools.wraps(method)
    def guarded(self: ValidatedSession, *args: Any, **kwargs: Any) -> Any:
        if not self._busy.acquire(blocking=False):
            raise SessionBusyError(f"this {self.backend_name} session is in use by another thread; a session serves "
                                   "one call at a time: open one session per thread")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy.release()

    return guarded  # type: ignore[return-value]


class ValidatedSession(BackendSession):
    """Wraps any backend session; validates every input, then delegates (and copies to contiguous).

    Calls from two threads at once are refused with SessionBusyError (see _one_call_at_a_time).
    """

    def __init__(self, inner: BackendSession, shape: ModelShape, max_batch: int, backend_name: str) -> None:
        self.inner = inner
        self.shape = shape
        self.max_batch = max_batch
        self.backend_name = backend_name
        self._busy = threading.Lock()
        self.threads = 1  # threads per step in use (set by registry.open_session)

    @_one_call_at_a_time
    def set_state(self, state: TrainState) -> None:
        validate_state(state, self.shape)
        self.inner.set_state(state)

    @_one_call_at_a_time
    def get_state(self) -> TrainState:
        return self.inner.get_state()

    @_one_call_at_a_time
    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        validate_batch(tokens, lengths, self.shape, steps=True, max_batch=self.max_batch)
        validate_lrs(lrs, tokens.shape[0])
        tokens, lengths, lrs = (np.ascontiguousarray(a) for a in (tokens, lengths, lrs))
        return self.inner.train_steps(tokens, lengths, lrs)

    @_one_call_at_a_time
    def loss_and_grads(
        self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True
    ) -> tuple[float, np.ndarray | None]:
        validate_batch(tokens, lengths, self.shape, steps=False, max_batch=self.max_batch)
        tokens, lengths = np.ascontiguousarray(tokens), np.ascontiguousarray(lengths)
        return self.inner.loss_and_grads(tokens, lengths, want_grads)

    @_one_call_at_a_time
    def set_threads(self, n: int) -> int:
        """Threads per step from the next call on (threads: auto); the count in use. One thread without
        ThreadedSession."""
        if isinstance(self.inner, ThreadedSession):
            self.threads = int(self.inner.set_threads(n))
        return self.threads

    @property
    def takes_optimizer(self) -> bool:
        """Whether the backend's session has set_optimizer (OptimizerSession); without it only the default
        optimiser runs."""
        return isinstance(self.inner, OptimizerSession)

    @_one_call_at_a_time
    def set_optimizer(self, opt: OptimizerSettings) -> None:
        """AdamW's settings from the next update on, checked first (BatchError names the bad one); a session
        without set_optimizer takes the default settings (it runs them already) and refuses any others."""
        problem = opt.problem()
        if problem is not None:
            raise BatchError(f"optimiser {problem[0]} {problem[1]}")
        if isinstance(self.inner, OptimizerSession):
            self.inner.set_optimizer(opt)
        elif not opt.is_default:
            raise BackendSelectionError(f"backend '{self.backend_name}' has no set_optimizer: its sessions run "
                                        "only the default optimiser")

    @_one_call_at_a_time
    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> ValidatedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
