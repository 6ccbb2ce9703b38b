"""Adam and the learning-rate schedule: the specification every backend reproduces."""

from __future__ import annotations

import numpy as np

ADAM_BETA1 = 0.85
ADAM_BETA2 = 0.99
ADAM_EPS = 1e-8


def lr_at(step: int, total_steps: int, lr0: float) -> float:
    """Linear decay to zero; step is 1-based: lr_1 = lr0, lr_{N+1} would be 0."""
    return lr0 * (1.0 - (step - 1) / total_steps)


def lr_schedule(first_step: int, n: int, total_steps: int, lr0: float) -> np.ndarray:
    """Learning rates for steps first_step .. first_step + n - 1 (1-based) as float32."""
    steps = np.arange(first_step, first_step + n, dtype=np.float64)
    return (lr0 * (1.0 - (steps - 1) / total_steps)).astype(np.float32)


def adam_update(
    params: np.ndarray, grads: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float
) -> None:
    """One bias-corrected Adam update in place; step is the 1-based index of this update."""
    m *= ADAM_BETA1
    m += (1.0 - ADAM_BETA1) * grads
    v *= ADAM_BETA2
    v += (1.0 - ADAM_BETA2) * grads * grads
    m_hat = m / (1.0 - ADAM_BETA1**step)
    v_hat = v / (1.0 - ADAM_BETA2**step)
    params -= (lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)).astype(params.dtype)
