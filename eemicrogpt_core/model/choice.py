"""Choosing the next token from logits: temperature, top-k, top-p (nucleus), greedy; vectorised over rows.

Temperature divides the logits after their maximum is subtracted, so no temperature > 0 overflows into
inf - inf: one so small that the scaled gaps underflow leaves only the top logit (ties share it) with any
probability, which is greedy, reached continuously. Greedy (temperature 0) takes the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..base.errors import ConfigError


@dataclass(frozen=True)
class Choice:
    temperature: float = 1.0  # 0: greedy
    top_k: int | None = None  # keep the k most likely tokens (ties with the k-th kept too, as nanoGPT does)
    top_p: float | None = None  # keep the fewest most likely tokens whose probabilities sum to >= top_p

    def check(self, vocab_size: int) -> None:
        """A ConfigError naming the option for a value no sampler can use."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and not 1 <= self.top_k <= vocab_size:
            raise ConfigError(f"top-k must be 1..{vocab_size} (the model's vocabulary), got {self.top_k}")
        if self.top_p is not None and not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def probabilities(logits: np.ndarray, choice: Choice) -> np.ndarray:
    """The distribution [n, vocab] (float64) the next tokens are drawn from; temperature must be > 0."""
    gaps = np.asarray(logits, dtype=np.float64)
    gaps = gaps - gaps.max(axis=-1, keepdims=True)  # <= 0, the top one 0: exp never overflows
    if choice.top_k is not None and choice.top_k < gaps.shape[-1]:
        kth = np.partition(gaps, -choice.top_k, axis=-1)[:, -choice.top_k, None]
        gaps[gaps < kth] = -np.inf
    with np.errstate(over="ignore", under="ignore"):  # a tiny temperature: huge negative gaps, exp -> 0
        probs = np.exp(gaps / choice.temperature)
    probs /= probs.sum(axis=-1, keepdims=True)
    if choice.top_p is not None and choice.top_p < 1:
        order = np.argsort(-probs, axis=-1, kind="stable")
        ranked = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(ranked, axis=-1) - ranked  # mass of the more likely tokens
        ranked[before >= choice.top_p] = 0  # the first token always stays (nothing before it)
        np.put_along_axis(probs, order, ranked, axis=-1)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def choose(logits: np.ndarray, choice: Choice, rng: np.random.Generator) -> np.ndarray:
    """One token per row of logits [n, vocab]: int64 [n]."""
    if choice.greedy:
        return np.asarray(logits).argmax(axis=-1).astype(np.int64)
    cdf = np.cumsum(probabilities(logits, choice), axis=-1)
    u = rng.random((cdf.shape[0], 1)) * cdf[:, -1:]
    # inverse CDF: the first token whose cumulative mass exceeds u; a zero-probability token never does
    return np.minimum((cdf <= u).sum(axis=-1), cdf.shape[-1] - 1).astype(np.int64)
