"""One numpy_ref training step: the core's reference forward and backward (eemicrogpt_core.model.reference),
then AdamW without temporaries."""

from __future__ import annotations

import numpy as np

from eemicrogpt_core.base.errors import NonFiniteError
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, clip_scale
from eemicrogpt_core.model.reference import Batch, StepModel


class Adam:
    """eemicrogpt_core.model.optim.adam_update, operation for operation, without its temporaries.

    The spec allocates a fresh array per operation, which at d_model 128 costs about as much as forward and
    backward together (1.7 ms of 3.4 ms per step); here every operation writes into two scratch buffers.
    Same operations in the same order on the same dtypes, so the result is bit-identical to the spec for any
    `opt` (tests/test_numpy_ref.py checks that). With the default settings clipping and decay are skipped,
    as in the spec, so those steps are the original Adam's.
    """

    def __init__(self, n: int, dtype: np.dtype) -> None:
        self.a = np.empty(n, dtype)
        self.b = np.empty(n, dtype)
        self.opt: OptimizerSettings = DEFAULT_OPTIMIZER

    def update(
        self, params: np.ndarray, grads: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float
    ) -> None:
        """One update; `grads` is scaled in place when clipping engages (the model rewrites it every step)."""
        a, b, opt = self.a, self.b, self.opt
        scale = clip_scale(grads, opt.grad_clip)
        if scale != 1.0:
            np.multiply(grads, np.asarray(scale, dtype=grads.dtype), out=grads)
        if opt.weight_decay > 0.0:
            np.multiply(params, np.asarray(1.0 - lr * opt.weight_decay, dtype=params.dtype), out=params)
        np.multiply(m, opt.beta1, out=m)
        np.multiply(grads, 1.0 - opt.beta1, out=a)
        np.add(m, a, out=m)
        np.multiply(v, opt.beta2, out=v)
        np.multiply(grads, 1.0 - opt.beta2, out=a)
        np.multiply(a, grads, out=a)
        np.add(v, a, out=v)
        np.divide(m, 1.0 - opt.beta1**step, out=a)  # m_hat
        np.divide(v, 1.0 - opt.beta2**step, out=b)  # v_hat
        np.multiply(lr, a, out=a)
        np.sqrt(b, out=b)
        np.add(b, opt.eps, out=b)
        np.divide(a, b, out=a)
        np.subtract(params, a, out=params)


def train_step(
    model: StepModel, adam: Adam, batch: Batch, m: np.ndarray, v: np.ndarray, step: int, lr: float
) -> float:
    """Forward, backward and one AdamW update of the model's parameters; returns the loss before it.

    `step` is the 1-based index of this update. On a non-finite loss nothing is updated.
    """
    with np.errstate(invalid="ignore", over="ignore"):  # reported below as one clear error instead
        loss, cache = model.forward(batch)
    if not np.isfinite(loss):
        raise NonFiniteError(f"non-finite loss ({loss}) at update {step}; parameters left unchanged")
    model.backward(batch, cache)
    adam.update(model.params, model.grads, m, v, step, lr)
    return loss
