"""Autoregressive generation from trained parameters with a small numpy forward pass (float64).

All sequences grow together, one position per iteration; a sequence is finished once it emits the boundary
token. The forward pass is the model of issue 2, written out again here for inference only so the core does
not depend on any backend package.
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError
from .model import BOUNDARY, MAX_SEQ, RMS_EPS, ModelShape, views


def _rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def forward_logits(params: np.ndarray, shape: ModelShape, tokens: np.ndarray) -> np.ndarray:
    """Logits [N, T, VOCAB] for token prefixes [N, T] (T <= MAX_SEQ), causal: row t sees tokens 0..t."""
    n, t = tokens.shape
    if not 1 <= t <= MAX_SEQ:
        raise ValueError(f"prefix length must be 1..{MAX_SEQ}, got {t}")
    w = views(shape, np.asarray(params, dtype=np.float64))
    x = _rms(w["tok_emb"][tokens] + w["pos_emb"][:t])
    h = _rms(x)
    heads, hd = shape.n_heads, shape.head_dim

    def split_heads(m: np.ndarray) -> np.ndarray:  # [N, T, D] -> [N, H, T, hd]
        return m.reshape(n, t, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = (split_heads(h @ w[name].T) for name in ("Wq", "Wk", "Wv"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v
    x = x + attn.transpose(0, 2, 1, 3).reshape(n, t, shape.d_model) @ w["Wo"].T
    x = x + np.maximum(_rms(x) @ w["Wf1"].T, 0.0) @ w["Wf2"].T
    return x @ w["Wlm"].T


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
