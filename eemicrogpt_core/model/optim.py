"""Adam and the learning-rate schedule: the specification every backend reproduces.

The schedule lives here, in Python: the trainer hands each backend one learning rate per step (a float32
array), so a new schedule needs nothing from the native code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ADAM_BETA1 = 0.85
ADAM_BETA2 = 0.99
ADAM_EPS = 1e-8

LR_SCHEDULES = ("linear", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    """Warm-up, then decay from `lr` towards `min_lr` over the remaining steps.

    Steps are 1-based. Steps 1..warmup_steps ramp linearly: step s uses lr * s / warmup_steps. The decay
    runs over the steps after the warm-up: with p = (s - 1 - warmup_steps) / (total - warmup_steps),
    linear uses min_lr + (lr - min_lr) * (1 - p) and cosine min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2, so
    the first decay step uses lr and step total + 1 would use min_lr. With no warm-up and min_lr 0, linear is
    lr * (1 - (s - 1) / total), the schedule this model has always used, to the bit.
    """

    lr: float
    kind: str = "linear"
    warmup_steps: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in LR_SCHEDULES:
            raise ValueError(f"lr schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.kind!r}")

    def rates(self, first_step: int, n: int, total_steps: int) -> np.ndarray:
        """Learning rates for steps first_step .. first_step + n - 1 (1-based) as float32."""
        steps = np.arange(first_step, first_step + n, dtype=np.float64)
        p = (steps - 1 - self.warmup_steps) / max(total_steps - self.warmup_steps, 1)
        factor = 1.0 - p if self.kind == "linear" else 0.5 * (1.0 + np.cos(math.pi * p))
        lrs = self.min_lr + (self.lr - self.min_lr) * factor
        if self.warmup_steps:
            warm = steps <= self.warmup_steps
            lrs[warm] = self.lr * steps[warm] / self.warmup_steps
        return lrs.astype(np.float32)

    def at(self, step: int, total_steps: int) -> float:
        """The rate of one step (as the backend receives it: float32)."""
        return float(self.rates(step, 1, total_steps)[0])

    def describe(self) -> str:
        warm = f"{self.warmup_steps:,} warm-up steps, then " if self.warmup_steps else ""
        return f"{warm}{self.kind} decay to {self.min_lr:g}"


def lr_schedule(first_step: int, n: int, total_steps: int, lr0: float) -> np.ndarray:
    """The default schedule (linear decay to zero, no warm-up) for steps first_step .. first_step + n - 1."""
    return LrSchedule(lr0).rates(first_step, n, total_steps)


# The largest value an optimiser setting may take (the C ABI's EMG_OPTIMIZER_MAX: finite and below float32's
# range).
OPTIMIZER_MAX = 1e30


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW's settings (the C ABI's emg_optimizer): the defaults are the model's original Adam, bit for bit.

    weight_decay is decoupled (p *= 1 - lr * weight_decay before the Adam step) and applies to every tensor:
    all of this model's tensors are matrices, and nanoGPT decays every 2-D tensor. grad_clip > 0 scales the
    whole gradient by grad_clip / norm when its global L2 norm exceeds grad_clip (before Adam, as torch's
    clip_grad_norm_). 0 turns either off.
    """

    beta1: float = ADAM_BETA1
    beta2: float = ADAM_BETA2
    eps: float = ADAM_EPS
    weight_decay: float = 0.0
    grad_clip: float = 0.0

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) for the first setting outside its range, else None (NaN is outside).

        Each value is judged as the native backends receive it, rounded to float32: beta1 = 1 - 1e-9 rounds to
        1 and eps = 1e-46 to 0, which emg_set_optimizer refuses."""

        def as_float32(name: str) -> float:
            with np.errstate(over="ignore"):
                return float(np.float32(getattr(self, name)))

        for name in ("beta1", "beta2"):
            if not 0.0 <= as_float32(name) < 1.0:
                return name, f"must be in [0, 1) (as a float32), got {getattr(self, name)!r}"
        if not 0.0 < as_float32("eps") < OPTIMIZER_MAX:
            return "eps", f"must be > 0 and finite (as a float32), got {self.eps!r}"
        for name in ("weight_decay", "grad_clip"):
            if not 0.0 <= as_float32(name) < OPTIMIZER_MAX:
                return name, f"must be >= 0 and finite, below {OPTIMIZER_MAX:g} (0 is off), got {getattr(self, name)!r}"
        return None

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_OPTIMIZER


DEFAULT_OPTIMIZER = OptimizerSettings()


def clip_scale(grads: np.ndarray, clip: float) -> float:
    """The factor global-norm clipping multiplies the gradient by: clip / norm when clip > 0 and the norm
    (summed in float64) exceeds it, else 1."""
    if clip <= 0.0:
        return 1.0
    norm = float(np.sqrt(np.dot(grads.astype(np.float64, copy=False), grads.astype(np.float64, copy=False))))
    return clip / norm if norm > clip else 1.0


def adam_update(
    params: np.ndarray,
    grads: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    step: int,
    lr: float,
    opt: OptimizerSettings = DEFAULT_OPTIMIZER,
) -> None:
    """One bias-corrected AdamW update in place (clipping included); step is the 1-based index of this
    update. The order of operations is the C ABI's ("Step" in eemicrogpt.h)."""
    scale = clip_scale(grads, opt.grad_clip)
    if scale != 1.0:
        grads = grads * np.asarray(scale, dtype=grads.dtype)
    if opt.weight_decay > 0.0:
        params *= np.asarray(1.0 - lr * opt.weight_decay, dtype=params.dtype)
    m *= opt.beta1
    m += (1.0 - opt.beta1) * grads
    v *= opt.beta2
    v += (1.0 - opt.beta2) * grads * grads
    m_hat = m / (1.0 - opt.beta1**step)
    v_hat = v / (1.0 - opt.beta2**step)
    params -= (lr * m_hat / (np.sqrt(v_hat) + opt.eps)).astype(params.dtype)
