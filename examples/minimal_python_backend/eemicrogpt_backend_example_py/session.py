"""The session: the training state, the optimiser's settings, train_steps (loss before update, one AdamW update per
step) and checks."""

from __future__ import annotations

import numpy as np

from eemicrogpt_core.backends.backend import STATE_ARRAYS, TrainState
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, adam_update
from eemicrogpt_core.model.shape import ModelShape

from .maths import loss_and_grads


class ExampleSession:
    """float32 state, as the checkpoint stores it. The core has validated every array before it gets here."""

    def __init__(self, shape: ModelShape, max_batch: int, dtype: str = "float32") -> None:
        if dtype != "float32":
            raise ValueError(f"example_py computes in float32, not {dtype}")
        self.shape = shape
        self.state = TrainState.fresh(np.zeros(shape.n_params, np.float32))
        self.opt = DEFAULT_OPTIMIZER

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        """Optional (the core refuses other settings to sessions without it): betas, eps, decay and clipping for
        every later update. The core has checked the values."""
        self.opt = opt

    def set_state(self, state: TrainState) -> None:
        # Copies: the caller keeps its arrays, and float64 input becomes the float32 the session works in.
        self.state = TrainState(*(np.array(a, np.float32) for a in (state.params, state.adam_m, state.adam_v)),
                                int(state.step))

    def get_state(self) -> TrainState:
        return self.state.copy()  # copies again: nobody outside may alias the live buffers

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        """One step per lr: its loss is taken before its update; every step updates, the last one too."""
        s = self.state
        losses = np.empty(len(lrs), np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # reported below as FloatingPointError
            for i, lr in enumerate(lrs):
                loss, grads = loss_and_grads(self.shape, s.params, tokens[i], lengths[i], want_grads=True)
                if not np.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss {loss} at step {s.step + 1}; state left at step "
                                             f"{s.step}")
                adam_update(s.params, grads, s.adam_m, s.adam_v, s.step + 1, float(lr), self.opt)
                s.step += 1
                losses[i] = loss
        for name in STATE_ARRAYS:
            if not np.all(np.isfinite(getattr(s, name))):
                raise FloatingPointError(f"non-finite {name} after step {s.step}")
        return losses

    def loss_and_grads(
        self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True
    ) -> tuple[float, np.ndarray | None]:
        return loss_and_grads(self.shape, self.state.params, tokens, lengths, want_grads)

    def close(self) -> None:
        """Nothing to release."""
