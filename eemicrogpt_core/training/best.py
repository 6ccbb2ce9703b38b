"""The best validation loss so far, for `keep_best` (best.npz) and `patience` (early stopping).

A validation round is a log step with a validation loss. A round improves when its loss is strictly lower
than the best so far; `patience: N` stops the run at the end of the N-th round in a row that does not. The
checkpoint keeps this record, so a resumed run counts on from where it stopped, and a run that stopped early
is finished (`--resume --steps N` trains it on, counting rounds afresh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class BestSoFar:
    val_loss: float | None = None  # the lowest validation loss so far (None before the first round)
    step: int = 0  # where it was reached
    stale_rounds: int = 0  # validation rounds since it was last improved
    stopped_at: int | None = None  # the step at which patience ran out, if it did

    def observe(self, step: int, val_loss: float) -> bool:
        """Count one validation round; True when it is the best so far."""
        if self.val_loss is None or val_loss < self.val_loss:
            self.val_loss, self.step, self.stale_rounds = val_loss, step, 0
            return True
        self.stale_rounds += 1
        return False

    def out_of_patience(self, patience: int | None) -> bool:
        return patience is not None and self.stale_rounds >= patience

    def describe(self) -> str:
        if self.val_loss is None:
            return "no validation round yet"
        return f"best val loss {self.val_loss:.4f} at step {self.step:,}"

    def as_meta(self) -> dict[str, Any]:
        return {"val_loss": self.val_loss, "step": self.step, "stale_rounds": self.stale_rounds,
                "stopped_at": self.stopped_at}

    @classmethod
    def from_meta(cls, value: Any, step: int) -> BestSoFar:
        """The record a checkpoint of `step` holds; ValueError names what is wrong with it."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping, got {type(value).__name__}")
        loss = value.get("val_loss")
        if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool)
                                 or not math.isfinite(loss)):
            raise ValueError(f"val_loss must be a finite number or null, got {loss!r}")
        def step_field(key: str, optional: bool = False) -> int | None:
            v = value.get(key)
            if v is None and optional:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= step:
                raise ValueError(f"{key} must be an integer in 0..{step}, got {v!r}")
            return v

        return cls(None if loss is None else float(loss), step_field("step") or 0, step_field("stale_rounds") or 0,
                   step_field("stopped_at", optional=True))
