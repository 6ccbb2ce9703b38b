"""The model's forward pass for generation, in float32, one new position per step with a key/value cache.

The maths is reference.py's (RMS norm without gain, causal multi-head attention, ReLU MLP, no final norm),
reorganised for inference: `prefill` runs whole prefixes [n, t] at once and keeps every layer's keys and
values; `step` then adds one position to all n sequences, attending over the cached keys and values, so a
new token costs one position's matmuls instead of the whole prefix again.

Positions are learned embeddings added at the input, so a cached key depends on where its token sat in the
window: once a window is full, moving it by one changes every cached value. Whoever slides the window (see
generation.py) therefore calls `prefill` again on the cropped window.
"""

from __future__ import annotations

import numpy as np

from .shape import RMS_EPS, ModelShape, layer_tensor, views

_F32 = np.float32


def _rms(x: np.ndarray) -> np.ndarray:
    # np.mean's Python-level bookkeeping costs more than the arithmetic at one position: sum, then scale
    mean_square = np.add.reduce(x * x, axis=-1, keepdims=True) * _F32(1.0 / x.shape[-1])
    return x / np.sqrt(mean_square + _F32(RMS_EPS))


def _softmax_last(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


class CachedModel:
    """Incremental float32 forward for n sequences that grow together (all at the same length).

    The weights are transposed once to [in, out] so every product is `x @ W`; the cache holds, per layer,
    K and V as [n, heads, context, head_dim].
    """

    def __init__(self, params: np.ndarray, shape: ModelShape) -> None:
        p = views(shape, np.asarray(params, dtype=_F32))
        self.shape = shape
        self.tok_emb, self.pos_emb = p["tok_emb"], p["pos_emb"]
        self.layers = []
        for layer in range(shape.n_layers):
            w = {name: p[layer_tensor(layer, name)] for name in ("Wq", "Wk", "Wv", "Wo", "Wf1", "Wf2")}
            wqkv = np.ascontiguousarray(np.concatenate([w["Wq"], w["Wk"], w["Wv"]]).T)  # [D, 3D]
            self.layers.append((wqkv, np.ascontiguousarray(w["Wo"].T), np.ascontiguousarray(w["Wf1"].T),
                                np.ascontiguousarray(w["Wf2"].T)))
        self.wlm = np.ascontiguousarray(p["Wlm"].T)  # [D, vocab]
        self.scale = _F32(1.0 / np.sqrt(shape.head_dim))
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.length = 0  # positions held in the cache

    @staticmethod
    def cache_bytes(shape: ModelShape, n: int) -> int:
        """Bytes of the key/value cache for n sequences."""
        return n * shape.n_layers * 2 * shape.context * shape.d_model * 4

    def _split_heads(self, x: np.ndarray) -> np.ndarray:
        """[n, t, D] -> [n, H, t, head_dim]."""
        n, t, _ = x.shape
        return x.reshape(n, t, self.shape.n_heads, self.shape.head_dim).transpose(0, 2, 1, 3)

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        """Start over with these prefixes [n, t] (1 <= t <= context): the logits [n, vocab] after the last token.

        Only the last position's logits are wanted, so the last layer's attention output and MLP run on
        that position alone (its keys and values are still cached for every position)."""
        n, t = tokens.shape
        shape = self.shape
        if not 1 <= t <= shape.context:
            raise ValueError(f"prefix length must be 1..{shape.context}, got {t}")
        if not self.keys or self.keys[0].shape[0] != n:
            cache = (n, shape.n_heads, shape.context, shape.head_dim)
            self.keys = [np.empty(cache, _F32) for _ in self.layers]
            self.values = [np.empty(cache, _F32) for _ in self.layers]
        x = _rms(self.tok_emb[tokens] + self.pos_emb[:t])  # [n, t, D]
        causal = np.triu(np.full((t, t), -np.inf, _F32), k=1)
        last = len(self.layers) - 1
        for i, (wqkv, wo, wf1, wf2) in enumerate(self.layers):
            q, k, v = (self._split_heads(part) for part in np.split(_rms(x) @ wqkv, 3, axis=-1))
            self.keys[i][:, :, :t] = k
            self.values[i][:, :, :t] = v
            if i == last:  # the logits read the last position only: nothing else of this layer is needed
                q, x, mask = q[:, :, -1:], x[:, -1:], causal[-1:]
            else:
                mask = causal
            probs = _softmax_last((q @ k.swapaxes(-1, -2)) * self.scale + mask)
            att = (probs @ v).transpose(0, 2, 1, 3).reshape(n, x.shape[1], shape.d_model)
            x = x + att @ wo
            x = x + np.maximum(_rms(x) @ wf1, 0) @ wf2
        self.length = t
        return x[:, -1] @ self.wlm

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token [n] to every sequence: the logits [n, vocab] after it. The cache must have room."""
        shape, t = self.shape, self.length
        if not 1 <= t < shape.context:
            raise ValueError(f"step needs 1..{shape.context - 1} cached positions, has {t}")
        n = tokens.shape[0]
        x = _rms(self.tok_emb[tokens] + self.pos_emb[t])  # [n, D]
        for i, (wqkv, wo, wf1, wf2) in enumerate(self.layers):
            qkv = (_rms(x) @ wqkv).reshape(n, 3, shape.n_heads, shape.head_dim)
            keys, values = self.keys[i], self.values[i]
            keys[:, :, t] = qkv[:, 1]
            values[:, :, t] = qkv[:, 2]
            # [n, H, 1, hd] @ [n, H, hd, t+1]: this position's scores against every cached one (all earlier)
            probs = _softmax_last((qkv[:, 0, :, None, :] @ keys[:, :, : t + 1].swapaxes(-1, -2)) * self.scale)
            att = (probs @ values[:, :, : t + 1]).reshape(n, shape.d_model)
            x = x + att @ wo
            x = x + np.maximum(_rms(x) @ wf1, 0) @ wf2
        self.length = t + 1
        return x @ self.wlm

    def keep(self, rows: np.ndarray) -> None:
        """Keep only these sequences (by index) in the cache: finished ones stop costing work."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
