"""Time to a target loss (the `target_loss` key): which step first reached it and the training seconds to it.

With `target_metric: train` (the default) the loss compared with the target is the train loss the progress
lines print: the mean of the last ROLLING per-step losses (of all steps so far in a run's first ROLLING
steps), each step's loss being the one computed before that step's update. The target is reached at the
first step whose running mean is <= the target; that step is `steps_to_target`, counted from the run's start
across resumes. With `target_metric: val` it is the validation loss, computed at log steps only: the target
is reached at the first log step whose validation loss is <= the target, and the run stops there.

`seconds_to_target` is training time only, as time-budget runs measure it: the seconds inside the backend's
train_steps calls, summed over every invocation of the run (the checkpoint keeps the sum), without batch
sampling, validation, checkpoints or start-up. A chunk of steps is timed as a whole, so the seconds to a
step inside a chunk are interpolated by steps: the seconds before the chunk plus the chunk's seconds times
k/n for its k-th of n steps. Training stops at the end of that chunk; the final checkpoint and losses are
of the chunk's last step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

ROLLING = 100  # the printed train loss is the mean of the last 100 steps
TARGET_METRICS = ("train", "val")


@dataclass(frozen=True)
class TargetReached:
    """Where a run reached its target: the step, the training seconds to it, and the step it stopped at."""

    step: int
    seconds: float
    stop: int  # the end of the chunk in which it was reached (where a run stopped for it)


class TargetSettings(Protocol):
    """The two TrainConfig keys a target needs (TrainConfig imports this module, so not TrainConfig itself)."""

    @property
    def target_loss(self) -> float | None: ...

    @property
    def target_metric(self) -> str: ...


@dataclass(frozen=True)
class TargetOutcome:
    """A run's result against its target_loss, as recorded in metrics, results and the Python API."""

    target_loss: float
    reached: bool
    steps_to_target: int | None = None
    seconds_to_target: float | None = None
    metric: str = "train"  # one of TARGET_METRICS

    @classmethod
    def of(cls, target_loss: float, reached: TargetReached | None, metric: str) -> TargetOutcome:
        if reached is None:
            return cls(target_loss, False, metric=metric)
        return cls(target_loss, True, reached.step, reached.seconds, metric)

    @classmethod
    def of_run(cls, config: TargetSettings, reached: TargetReached | None) -> TargetOutcome | None:
        """The outcome of a run with this TrainConfig (None when it has no target_loss)."""
        if config.target_loss is None:
            return None
        return cls.of(config.target_loss, reached, config.target_metric)

    def as_record(self) -> dict[str, Any]:
        seconds = round(self.seconds_to_target, 6) if self.seconds_to_target is not None else None
        return {"target_loss": self.target_loss, "target_metric": self.metric, "reached": self.reached,
                "steps_to_target": self.steps_to_target, "seconds_to_target": seconds}

    def describe(self) -> str:
        what = f"{self.metric} loss <= {self.target_loss:g}"
        if self.steps_to_target is None or self.seconds_to_target is None:
            return f"{what} not reached"
        return f"{what} reached at step {self.steps_to_target:,} after {self.seconds_to_target:.3f} s of training"


def running_means(recent: Sequence[float], losses: np.ndarray, window: int = ROLLING) -> np.ndarray:
    """The running train loss after each of `losses`, continuing from `recent`: the losses just before them,
    as many as the window holds (all of them in a run's first `window` steps)."""
    values = np.concatenate([np.asarray(recent, np.float64), np.asarray(losses, np.float64)])
    sums = np.concatenate([[0.0], np.cumsum(values)])
    ends = np.arange(len(recent) + 1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def first_reached(recent: Sequence[float], losses: np.ndarray, target: float) -> int | None:
    """The index in `losses` of the first step whose running train loss is <= target, or None."""
    at_or_below = running_means(recent, losses) <= target
    return int(np.argmax(at_or_below)) if at_or_below.any() else None


def seconds_within(before: float, chunk_seconds: float, k: int, n: int) -> float:
    """Training seconds up to the k-th (1-based) of a chunk's n steps, interpolated by steps."""
    return before + chunk_seconds * (k / n)
