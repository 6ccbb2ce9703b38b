"""Autoregressive generation from trained parameters with a small numpy forward pass (float64).

All sequences grow together, one position per iteration; a sequence is finished once it emits the boundary
token or fills the context. The forward pass is the core's reference model (reference.py), the one
numpy_ref trains with.
"""

from __future__ import annotations

import numpy as np

from ..base.errors import ConfigError
from .reference import StepModel, prefix_batch
from .shape import ModelShape
from .vocab import Vocabulary

MAX_UNIQUE_TRIES = 50  # rounds of drawing when `unique` asks for more distinct names than the model gives


def forward_logits(params: np.ndarray, shape: ModelShape, tokens: np.ndarray) -> np.ndarray:
    """Logits [N, T, vocab] for token prefixes [N, T] (T <= context), causal: row t sees tokens 0..t."""
    n, t = tokens.shape
    if not 1 <= t <= shape.context:
        raise ValueError(f"prefix length must be 1..{shape.context}, got {t}")
    model = StepModel(shape, np.array(params, dtype=np.float64))
    logits, _ = model.logits(prefix_batch(tokens))
    return logits.reshape(n, t, shape.vocab)


def _draw(params: np.ndarray, shape: ModelShape, start: list[int], n: int, temperature: float, max_len: int,
          rng: np.random.Generator) -> np.ndarray:
    """n continuations of `start` (boundary first), each up to max_len tokens in all after the boundary."""
    b = shape.boundary
    seqs = np.tile(np.array(start, dtype=np.int64), (n, 1))
    finished = np.zeros(n, dtype=bool)
    while seqs.shape[1] <= max_len and not finished.all():
        logits = forward_logits(params, shape, seqs)[:, -1]
        if temperature == 0:
            nxt = logits.argmax(axis=1)  # greedy: the most likely token
        else:
            scaled = logits / temperature
            probs = np.exp(scaled - scaled.max(axis=1, keepdims=True))
            cdf = np.cumsum(probs, axis=1)
            u = rng.random((n, 1)) * cdf[:, -1:]
            nxt = np.minimum((cdf <= u).sum(axis=1), b)  # inverse CDF, one draw per sequence
        nxt[finished] = b
        finished |= nxt == b
        seqs = np.concatenate([seqs, nxt[:, None]], axis=1)
    return seqs


def generate(params: np.ndarray, shape: ModelShape, vocab: Vocabulary, n: int = 20, temperature: float = 0.5,
             seed: int = 0, *, prefix: str = "", max_len: int | None = None, unique: bool = False) -> list[str]:
    """n names sampled at this temperature (0: greedy; lower: more typical names), each starting with prefix
    and at most max_len characters long (default and upper bound: the context); the same seed gives the same
    names. unique: distinct names, fewer than n when the model does not produce that many."""
    if not vocab.with_boundary:  # names end at the boundary token; a text has none to end a sample at
        raise ConfigError("this model was trained on a text (data_format: text); sampling names needs a list run")
    if n < 1:
        raise ConfigError(f"number of samples must be >= 1, got {n}")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if vocab.size != shape.vocab:
        raise ConfigError(f"the vocabulary has {vocab.size} tokens but the model {shape.vocab}")
    limit = shape.context
    max_len = limit if max_len is None else max_len
    if not 1 <= max_len <= limit:
        raise ConfigError(f"max length must be 1..{limit} (the model's context), got {max_len}")
    bad = vocab.unknown(prefix)
    if bad is not None:
        raise ConfigError(f"the prefix's character {bad!r} is not in the model's vocabulary")
    if len(prefix) >= max_len:
        raise ConfigError(f"the prefix has {len(prefix)} characters; it must be shorter than the max length {max_len}")
    rng = np.random.default_rng(seed)
    start = [vocab.boundary, *vocab.encode(prefix)]
    if temperature == 0:  # every draw is the same: one sequence is enough
        seqs = _draw(params, shape, start, 1, 0.0, max_len, rng)
        names = [vocab.decode(seqs[0, 1:])]
        return names if unique else names * n
    if not unique:
        return [vocab.decode(row[1:]) for row in _draw(params, shape, start, n, temperature, max_len, rng)]
    seen: dict[str, None] = {}
    for _ in range(MAX_UNIQUE_TRIES):
        for row in _draw(params, shape, start, n, temperature, max_len, rng):
            seen.setdefault(vocab.decode(row[1:]))
            if len(seen) == n:
                return list(seen)
    return list(seen)
