"""The model's reference maths in numpy: forward, loss and backward, in float32 or float64. Read it top to bottom.

The numpy_ref backend trains with it, sampling.py generates with its forward pass, and the native backends'
tests compare their gradients with it in float64. Adam's reference is optim.adam_update.

The model (microgpt's loop; no biases, weights stored W[out][in], so `y = x @ W.T`):

    x  = rms(tok_emb[tok] + pos_emb[t])
    for each layer:
        h  = rms(x);  q, k, v = Wq h, Wk h, Wv h
        x  = x + Wo · causal_softmax_attention(q, k, v)      (per head, scale 1/sqrt(head_dim))
        h  = rms(x);  x = x + Wf2 relu(Wf1 h)
    logits = Wlm x                                           (no final norm)
    loss = mean cross-entropy over live positions (t <= len - 2 predicts token t + 1)

with rms(x) = x / sqrt(mean(x^2) + 1e-5) and no gain. There are no Python loops over sequences, positions
or heads (only over layers).

Padding: position t of sequence b is live when t <= len_b - 2. Only live positions are computed: they are
packed into N rows ([N, D] arrays) for everything except attention, which scatters them into a zero-padded
[B, T] grid ([B, H, T, head_dim] arrays). Because attention is causal and the live positions of a sequence
are a prefix, the zero rows at dead positions are masked out of every live row's softmax. Padding tokens
are never read, so they cannot change a single bit of the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shape import LAYER_TENSORS, RMS_EPS, ModelShape, layer_tensor, views


@dataclass
class Batch:
    """The live positions of a batch, packed: row i is position positions[i] of sequence sequences[i].

    Projections, norms, the FFN and the loss run on these N packed rows only (about 60% of B x T for real
    names). Attention needs whole sequences, so it scatters rows into a zero-padded [B, T] grid with
    T = max(len) - 1, the last position that can be live.
    """

    n_seq: int  # B
    n_positions: int  # T
    rows: np.ndarray  # index of each live position in the flattened [B, T] grid, row-major
    positions: np.ndarray  # t of each live row
    inputs: np.ndarray  # token at each live row
    targets: np.ndarray  # token each live row predicts (the next one)

    @property
    def n_live(self) -> int:
        return self.rows.size

    def to_grid(self, packed: np.ndarray) -> np.ndarray:
        """[N, C] -> [B, T, C] with zeros at dead positions."""
        grid = np.zeros((self.n_seq * self.n_positions, packed.shape[-1]), dtype=packed.dtype)
        grid[self.rows] = packed
        return grid.reshape(self.n_seq, self.n_positions, -1)

    def to_rows(self, grid: np.ndarray) -> np.ndarray:
        """[B, T, C] -> [N, C], keeping live positions only."""
        return grid.reshape(self.n_seq * self.n_positions, -1).take(self.rows, axis=0)


def prepare_batch(tokens: np.ndarray, lengths: np.ndarray) -> Batch:
    """tokens uint8 [B, context + 1], lengths uint16 [B] (already validated) -> the packed live positions.

    Only tokens at live positions (inputs) and right after them (targets) are read: padding never is.
    """
    lengths = lengths.astype(np.intp)
    n_seq, n_positions = lengths.size, int(lengths.max()) - 1
    live = np.arange(n_positions) < (lengths[:, None] - 1)  # [B, T]
    rows = np.flatnonzero(live)
    sequences, positions = np.divmod(rows, n_positions)
    inputs = tokens[sequences, positions].astype(np.intp)
    targets = tokens[sequences, positions + 1].astype(np.intp)
    return Batch(n_seq, n_positions, rows, positions, inputs, targets)


def prefix_batch(tokens: np.ndarray) -> Batch:
    """Token prefixes [N, T] (T <= context), every position live: the batch whose logits sampling reads.

    There are no targets (they are set to 0 and only the loss would read them).
    """
    n_seq, n_positions = tokens.shape
    rows = np.arange(n_seq * n_positions)
    positions = rows % n_positions
    inputs = np.asarray(tokens, dtype=np.intp).reshape(-1)
    return Batch(n_seq, n_positions, rows, positions, inputs, np.zeros_like(inputs))


def rms_norm(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """y = x * r with r = 1 / sqrt(mean(x^2) + eps) over the last axis; r is kept for the backward pass."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(RMS_EPS))
    return x * r, r


def rms_norm_backward(dy: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """dx = r * (dy - y * mean(dy * y)): the chain rule through y = x * r(x)."""
    return r * (dy - y * np.mean(dy * y, axis=-1, keepdims=True))


def _heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """[B, T, D] -> [B, H, T, head_dim]."""
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """[B, H, T, head_dim] -> [B, T, D] (contiguous)."""
    b, h, t, hd = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * hd)


class StepModel:
    """Forward and backward for one model shape and dtype, over parameters held in one flat buffer.

    `params` and `grads` are flat buffers in the ABI's tensor order; the named views below alias them, so
    gradients are written straight into `grads` and Adam updates `params` in place.
    """

    def __init__(self, shape: ModelShape, params: np.ndarray, grads: np.ndarray | None = None) -> None:
        grads = np.zeros_like(params) if grads is None else grads
        self.shape = shape
        self.dtype = params.dtype
        self.params, self.grads = params, grads
        self.p = views(shape, params)
        self.g = views(shape, grads)
        # Per layer, its tensors by their short names (Wq ... Wf2) plus "Wqkv": Wq, Wk, Wv are adjacent in the
        # layout, so one [3D, D] view projects q, k and v in a single matmul.
        self.layer_p = [self._layer_views(self.p, params, layer) for layer in range(shape.n_layers)]
        self.layer_g = [self._layer_views(self.g, grads, layer) for layer in range(shape.n_layers)]
        self.scale = self.dtype.type(1.0 / np.sqrt(shape.head_dim))
        # Additive causal mask: position t attends to s <= t only.
        upper = np.triu(np.ones((shape.context, shape.context), dtype=bool), k=1)
        self.causal = np.where(upper, -np.inf, 0.0).astype(self.dtype)

    def weight_matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """a @ b for every product with a weight matrix (forward and input gradients) and every weight
        gradient: the GEMMs a reduced-precision backend rounds the operands of. A model of such a backend
        overrides this (the x86 bf16 tests do); attention's products go through attention_matmul, and the
        embedding sums stay exact. In backward the first operand is always the gradient."""
        return np.matmul(a, b, out=out)

    def attention_matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (batched over [B, H]) for attention's products: the scores, the value product and their
        four gradients. A model of a backend that rounds these operands too overrides it (the sme2_f16
        tests do). As in weight_matmul, in backward the first operand is always the gradient, so such a
        model can round it at the backend's own scale."""
        return a @ b

    def _layer_views(self, named: dict[str, np.ndarray], flat: np.ndarray, layer: int) -> dict[str, np.ndarray]:
        d = self.shape.d_model
        out = {name: named[layer_tensor(layer, name)] for name in LAYER_TENSORS}
        start = self.shape.offsets[layer_tensor(layer, "Wq")]
        assert self.shape.offsets[layer_tensor(layer, "Wv")] == start + 2 * d * d, "Wq, Wk, Wv must be adjacent"
        out["Wqkv"] = flat[start : start + 3 * d * d].reshape(3 * d, d)
        return out

    # ---- forward ------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> tuple[float, dict]:
        """The mean loss of the batch and every activation the backward pass needs ([N, ...] = packed rows)."""
        logits, cache = self.logits(batch)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        cache["log_probs"] = log_probs
        return -float(log_probs[np.arange(batch.n_live), batch.targets].mean()), cache

    def logits(self, batch: Batch) -> tuple[np.ndarray, dict]:
        """Logits [N, vocab] of the packed rows, and the activations the backward pass needs."""
        p = self.p
        x, r0 = rms_norm(p["tok_emb"][batch.inputs] + p["pos_emb"][batch.positions])  # [N, D]
        cache: dict = {"x0": x, "r0": r0, "layers": []}
        for w in self.layer_p:
            layer_cache = self._layer_forward(batch, w, x)
            cache["layers"].append(layer_cache)
            x = layer_cache["x_out"]
        cache["x_last"] = x
        return self.weight_matmul(x, p["Wlm"].T), cache  # [N, vocab]

    def _layer_forward(self, batch: Batch, w: dict[str, np.ndarray], x_in: np.ndarray) -> dict[str, np.ndarray]:
        n_heads, t = self.shape.n_heads, batch.n_positions
        h1, r1 = rms_norm(x_in)
        # Attention works on whole sequences: project the packed rows, then lay them out as [B, T].
        qkv = batch.to_grid(self.weight_matmul(h1, w["Wqkv"].T))  # [B, T, 3D]; dead positions are zero
        q, k, v = (_heads(part, n_heads) for part in np.split(qkv, 3, axis=-1))  # [B, H, T, hd] each
        scores = self.attention_matmul(q, k.swapaxes(-1, -2)) * self.scale + self.causal[:t, :t]  # [B, H, T, T]
        scores -= scores.max(axis=-1, keepdims=True)
        probs_att = np.exp(scores)
        probs_att /= probs_att.sum(axis=-1, keepdims=True)
        att = batch.to_rows(_merge_heads(self.attention_matmul(probs_att, v)))  # [N, D]
        x_mid = x_in + self.weight_matmul(att, w["Wo"].T)

        h2, r2 = rms_norm(x_mid)
        pre = self.weight_matmul(h2, w["Wf1"].T)  # [N, 4D]
        hidden = np.maximum(pre, 0)
        x_out = x_mid + self.weight_matmul(hidden, w["Wf2"].T)
        return dict(h1=h1, r1=r1, q=q, k=k, v=v, probs_att=probs_att, att=att, h2=h2, r2=r2, pre=pre,
                    hidden=hidden, x_out=x_out)

    # ---- backward -----------------------------------------------------------------------------------
    def backward(self, batch: Batch, c: dict) -> None:
        """Write d(loss)/d(params) into the gradient buffer (every element is overwritten).

        Weight gradients are sums over rows: dW = dy^T x for y = x W^T.
        """
        p, g, n = self.p, self.g, batch.n_live

        # Cross-entropy, mean over the N live rows: d(loss)/d(logits) = (softmax - onehot(target)) / N.
        dlogits = np.exp(c["log_probs"])
        dlogits[np.arange(n), batch.targets] -= 1
        dlogits *= self.dtype.type(1.0 / n)
        self.weight_matmul(dlogits.T, c["x_last"], out=g["Wlm"])
        dx = self.weight_matmul(dlogits, p["Wlm"])

        for layer in reversed(range(self.shape.n_layers)):
            dx = self._layer_backward(batch, self.layer_p[layer], self.layer_g[layer], c["layers"][layer], dx)

        # Embeddings: x0 = rms(tok_emb[tok] + pos_emb[t]). One-hot matmuls sum the rows sharing an index.
        demb = rms_norm_backward(dx, c["x0"], c["r0"])
        np.matmul(self._onehot(batch.inputs, self.shape.vocab).T, demb, out=g["tok_emb"])
        np.matmul(self._onehot(batch.positions, self.shape.context).T, demb, out=g["pos_emb"])

    def _layer_backward(self, batch: Batch, w: dict[str, np.ndarray], gw: dict[str, np.ndarray],
                        c: dict[str, np.ndarray], dx_out: np.ndarray) -> np.ndarray:
        """Given d(loss)/d(x_out) of one layer, write its weight gradients and return d(loss)/d(x_in)."""
        # FFN: x_out = x_mid + Wf2 relu(Wf1 h2).
        self.weight_matmul(dx_out.T, c["hidden"], out=gw["Wf2"])
        dpre = self.weight_matmul(dx_out, w["Wf2"]) * (c["pre"] > 0)
        self.weight_matmul(dpre.T, c["h2"], out=gw["Wf1"])
        dx_mid = dx_out + rms_norm_backward(self.weight_matmul(dpre, w["Wf1"]), c["h2"], c["r2"])

        # Attention output projection: x_mid = x_in + Wo att.
        self.weight_matmul(dx_mid.T, c["att"], out=gw["Wo"])
        datt = _heads(batch.to_grid(self.weight_matmul(dx_mid, w["Wo"])), self.shape.n_heads)  # [B, H, T, hd]

        # Softmax attention: att = P v with P = softmax(scale * q k^T + causal mask).
        probs_att = c["probs_att"]
        dv = self.attention_matmul(datt.swapaxes(-1, -2), probs_att).swapaxes(-1, -2)  # (datt^T P)^T: gradient first
        dprobs = self.attention_matmul(datt, c["v"].swapaxes(-1, -2))
        dscores = probs_att * (dprobs - (dprobs * probs_att).sum(axis=-1, keepdims=True))
        dscores *= self.scale
        dq = self.attention_matmul(dscores, c["k"])
        dk = self.attention_matmul(dscores.swapaxes(-1, -2), c["q"])

        # Q, K, V projections from h1 = rms(x_in), all three at once through the [3D, D] view.
        dqkv = batch.to_rows(np.concatenate([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)], axis=-1))
        self.weight_matmul(dqkv.T, c["h1"], out=gw["Wqkv"])
        return dx_mid + rms_norm_backward(self.weight_matmul(dqkv, w["Wqkv"]), c["h1"], c["r1"])

    def _onehot(self, index: np.ndarray, size: int) -> np.ndarray:
        out = np.zeros((index.size, size), dtype=self.dtype)
        out[np.arange(index.size), index] = 1
        return out

    def loss_and_grads(self, batch: Batch) -> float:
        loss, cache = self.forward(batch)
        self.backward(batch, cache)
        return loss


def loss_and_grads(
    shape: ModelShape, params: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, dtype: type = np.float64
) -> tuple[float, np.ndarray, dict]:
    """Mean loss, flat gradient and activations of one batch, computed in `dtype` from a copy of params."""
    model = StepModel(shape, np.array(params, dtype=dtype))
    batch = prepare_batch(tokens, lengths)
    loss, cache = model.forward(batch)
    model.backward(batch, cache)
    return loss, model.grads, cache
