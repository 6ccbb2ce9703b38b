"""The numpy_ref BackendSession: holds the training state and runs step.py over it."""

from __future__ import annotations

import numpy as np

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.base.errors import NonFiniteError
from eemicrogpt_core.model.optim import OptimizerSettings
from eemicrogpt_core.model.reference import StepModel, prepare_batch
from eemicrogpt_core.model.shape import ModelShape

from .step import Adam, train_step

DTYPES = ("float32", "float64")


class NumpySession:
    """Parameters, Adam moments and gradients live in the session's dtype (float32 or float64).

    get_state returns copies in that dtype: float32 arrays (the ABI's type) for float32 sessions and float64
    arrays for float64 sessions, so that set_state(get_state()) is exact for both. set_state accepts arrays
    of either float dtype and converts them to the session's dtype.
    """

    def __init__(self, shape: ModelShape, max_batch: int, dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"numpy_ref computes in {' or '.join(DTYPES)}, not {dtype!r}")
        self.shape = shape
        self.max_batch = max_batch
        self.dtype = np.dtype(dtype)
        n = shape.n_params
        self._params, self._m, self._v, self._grads = (np.zeros(n, self.dtype) for _ in range(4))
        self._step = 0
        self._model = StepModel(shape, self._params, self._grads)
        self._adam = Adam(n, self.dtype)

    def set_state(self, state: TrainState) -> None:
        n = self.shape.n_params
        for what, src in (("params", state.params), ("adam_m", state.adam_m), ("adam_v", state.adam_v)):
            if np.shape(src) != (n,):
                raise ValueError(f"{what} must have shape ({n},) for {self.shape}, got {np.shape(src)}")
        if state.step < 0:
            raise ValueError(f"step must be >= 0, got {state.step}")
        # Copy into the existing buffers: the model's named views alias them.
        np.copyto(self._params, state.params, casting="same_kind")
        np.copyto(self._m, state.adam_m, casting="same_kind")
        np.copyto(self._v, state.adam_v, casting="same_kind")
        self._step = int(state.step)

    def get_state(self) -> TrainState:
        return TrainState(self._params.copy(), self._m.copy(), self._v.copy(), self._step)

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        """AdamW's settings for every later update (the OptimizerSession part of the protocol)."""
        problem = opt.problem()
        if problem is not None:
            raise ValueError(f"optimiser {problem[0]} {problem[1]}")
        self._adam.opt = opt

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        losses = np.empty(len(lrs), np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported by _check_finite instead
            for i in range(len(lrs)):
                batch = prepare_batch(tokens[i], lengths[i])
                losses[i] = train_step(self._model, self._adam, batch, self._m, self._v, self._step + 1, lrs[i])
                self._step += 1
        self._check_finite()
        return losses

    def _check_finite(self) -> None:
        """The session contract: a call never ends with non-finite state (it raises instead)."""
        for name, array in (("parameters", self._params), ("Adam m", self._m), ("Adam v", self._v)):
            if not np.all(np.isfinite(array)):
                raise NonFiniteError(f"non-finite {name} after update {self._step}")

    def loss_and_grads(
        self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True
    ) -> tuple[float, np.ndarray | None]:
        batch = prepare_batch(tokens, lengths)
        if not want_grads:
            loss, _ = self._model.forward(batch)
            return loss, None
        loss = self._model.loss_and_grads(batch)
        return loss, self._grads.copy()

    def close(self) -> None:
        """Nothing to release: the buffers are ordinary numpy arrays."""
