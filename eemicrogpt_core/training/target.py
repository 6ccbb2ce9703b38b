"""Time to a target loss (the `target_loss` key): which step first reached it and the training seconds to it.

The loss compared with the target is the train loss the progress lines print: the mean of the last ROLLING
per-step losses (of all steps so far in a run's first ROLLING steps), each step's loss being the one
computed before that step's update. The target is reached at the first step whose running mean is <= the
target; that step is `steps_to_target`, counted from the run's start across resumes.

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
from typing import Any

import numpy as np

ROLLING = 100  # the printed train loss is the mean of the last 100 steps


@dataclass(frozen=True)
class TargetReached:
    """Where a run reached its target: the step, the training seconds to it, and the step it stopped at."""

    step: int
    seconds: float
    stop: int  # the end of the chunk in which it was reached (where a run stopped for it)


@dataclass(frozen=True)
class TargetOutcome:
    """A run's result against its target_loss, as recorded in metrics, results and the Python API."""

    target_loss: float
    reached: bool
    steps_to_target: int | None = None
    seconds_to_target: float | None = None

    @classmethod
    def of(cls, target_loss: float, reached: TargetReached | None) -> TargetOutcome:
        if reached is None:
            return cls(target_loss, False)
        return cls(target_loss, True, reached.step, reached.seconds)

    def as_record(self) -> dict[str, Any]:
        seconds = round(self.seconds_to_target, 6) if self.seconds_to_target is not None else None
        return {"target_loss": self.target_loss, "reached": self.reached, "steps_to_target": self.steps_to_target,
                "seconds_to_target": seconds}

    def describe(self) -> str:
        if self.steps_to_target is None or self.seconds_to_target is None:
            return f"train loss <= {self.target_loss:g} not reached"
        return (f"train loss <= {self.target_loss:g} reached at step {self.steps_to_target:,} after "
                f"{self.seconds_to_target:.3f} s of training")


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
