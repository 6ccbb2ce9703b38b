"""Autoregressive generation from trained parameters with a small numpy forward pass (float64).

All sequences grow together, one position per iteration; a sequence is finished once it emits the boundary
token. The forward pass is the core's reference model (reference.py), the one numpy_ref trains with.
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError
from .model import BOUNDARY, MAX_SEQ, VOCAB, ModelShape
from .reference import StepModel, prefix_batch


def forward_logits(params: np.ndarray, shape: ModelShape, tokens: np.ndarray) -> np.ndarray:
    """Logits [N, T, VOCAB] for token prefixes [N, T] (T <= MAX_SEQ), causal: row t sees tokens 0..t."""
    n, t = tokens.shape
    if not 1 <= t <= MAX_SEQ:
        raise ValueError(f"prefix length must be 1..{MAX_SEQ}, got {t}")
    model = StepModel(shape, np.array(params, dtype=np.float64))
    logits, _ = model.logits(prefix_batch(tokens))
    return logits.reshape(n, t, VOCAB)


def generate(
    params: np.ndarray, shape: ModelShape, n: int = 20, temperature: float = 0.5, seed: int = 0
) -> list[str]:
    """n names sampled at this temperature (lower: more typical names); the same seed gives the same names."""
    if n < 1:
        raise ConfigError(f"number of samples must be >= 1, got {n}")
    if not temperature > 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")
    rng = np.random.default_rng(seed)
    seqs = np.full((n, 1), BOUNDARY, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    for _ in range(MAX_SEQ - 1):
        logits = forward_logits(params, shape, seqs)[:, -1] / temperature
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(probs, axis=1)
        u = rng.random((n, 1)) * cdf[:, -1:]
        nxt = np.minimum((cdf <= u).sum(axis=1), BOUNDARY)  # inverse CDF, one draw per sequence
        nxt[finished] = BOUNDARY
        finished |= nxt == BOUNDARY
        seqs = np.concatenate([seqs, nxt[:, None]], axis=1)
        if finished.all():
            break
    names = []
    for row in seqs[:, 1:]:
        chars = []
        for tok in row:
            if tok == BOUNDARY:
                break
            chars.append(chr(ord("a") + int(tok)))
        names.append("".join(chars))
    return names
