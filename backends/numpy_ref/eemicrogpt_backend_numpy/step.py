"""One training step of the eemicrogpt model in numpy: forward, backward, Adam. Read it top to bottom.

The model (one transformer block, no biases, weights stored W[out][in], so `y = x @ W.T`):

    x  = rms(tok_emb[tok] + pos_emb[t])
    h  = rms(x);  q, k, v = Wq h, Wk h, Wv h
    x  = x + Wo · causal_softmax_attention(q, k, v)      (per head, scale 1/sqrt(head_dim))
    h  = rms(x);  x = x + Wf2 relu(Wf1 h)
    logits = Wlm x
    loss = mean cross-entropy over live positions (t <= len - 2 predicts token t + 1)

with rms(x) = x / sqrt(mean(x^2) + 1e-5) and no gain. Every array carries the batch as its first axis
and positions as the second ([B, T, ...]); attention adds a head axis ([B, H, T, head_dim]). There are no
Python loops over positions or heads.

Padding: position t of sequence b is live when t <= len_b - 2. Because attention is causal and the live
positions of a sequence are a prefix, dead positions never influence live ones; their loss weight is 0, so
every gradient flowing back through them is exactly 0. Dead positions also read a fixed token instead of
whatever the caller left there, so padding bytes cannot change a single bit of the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eemicrogpt_core.model import BOUNDARY, MAX_SEQ, RMS_EPS, VOCAB, ModelShape, views
from eemicrogpt_core.optim import adam_update


@dataclass
class Batch:
    """A batch cut down to the positions that can be live: T = max(len) - 1 <= MAX_SEQ - 1."""

    inputs: np.ndarray  # int [B, T]; dead positions hold BOUNDARY
    targets: np.ndarray  # int [B, T]; dead positions hold 0
    weight: np.ndarray  # float [B, T]; 1 / n_live on live positions, 0 elsewhere

    @property
    def n_positions(self) -> int:
        return self.inputs.shape[1]


def prepare_batch(tokens: np.ndarray, lengths: np.ndarray, dtype: np.dtype) -> Batch:
    """tokens uint8 [B, MAX_SEQ], lengths uint8 [B] (already validated) -> the live part of the batch."""
    lengths = lengths.astype(np.intp)
    t = int(lengths.max()) - 1
    live = np.arange(t) < (lengths[:, None] - 1)
    n_live = int(lengths.sum()) - lengths.size
    inputs = np.where(live, tokens[:, :t], BOUNDARY).astype(np.intp)
    targets = np.where(live, tokens[:, 1 : t + 1], 0).astype(np.intp)
    weight = live.astype(dtype) / dtype.type(n_live)
    return Batch(inputs, targets, weight)


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

    def __init__(self, shape: ModelShape, params: np.ndarray, grads: np.ndarray) -> None:
        self.shape = shape
        self.dtype = params.dtype
        self.p = views(shape, params)
        self.g = views(shape, grads)
        # Wq, Wk, Wv are adjacent in the layout, so one [3D, D] view projects q, k and v in a single matmul.
        self.p_qkv = self._qkv_view(params)
        self.g_qkv = self._qkv_view(grads)
        self.scale = self.dtype.type(1.0 / np.sqrt(shape.head_dim))
        # Additive causal mask: position t attends to s <= t only.
        upper = np.triu(np.ones((MAX_SEQ, MAX_SEQ), dtype=bool), k=1)
        self.causal = np.where(upper, -np.inf, 0.0).astype(self.dtype)

    def _qkv_view(self, flat: np.ndarray) -> np.ndarray:
        d = self.shape.d_model
        start = self.shape.offsets["Wq"]
        assert self.shape.offsets["Wv"] == start + 2 * d * d, "Wq, Wk, Wv must be adjacent in the layout"
        return flat[start : start + 3 * d * d].reshape(3 * d, d)

    # ---- forward ------------------------------------------------------------------------------------
    def forward(self, batch: Batch) -> tuple[float, dict[str, np.ndarray]]:
        """The mean loss of the batch and every activation the backward pass needs."""
        p, n_heads, t = self.p, self.shape.n_heads, batch.n_positions

        x0, r0 = rms_norm(p["tok_emb"][batch.inputs] + p["pos_emb"][:t])
        h1, r1 = rms_norm(x0)

        qkv = h1 @ self.p_qkv.T  # [B, T, 3D]
        q, k, v = (_heads(part, n_heads) for part in np.split(qkv, 3, axis=-1))
        scores = (q @ k.swapaxes(-1, -2)) * self.scale + self.causal[:t, :t]  # [B, H, T, T]
        scores -= scores.max(axis=-1, keepdims=True)
        probs_att = np.exp(scores)
        probs_att /= probs_att.sum(axis=-1, keepdims=True)
        att = _merge_heads(probs_att @ v)  # [B, T, D]
        x1 = x0 + att @ p["Wo"].T

        h2, r2 = rms_norm(x1)
        pre = h2 @ p["Wf1"].T  # [B, T, 4D]
        hidden = np.maximum(pre, 0)
        x2 = x1 + hidden @ p["Wf2"].T

        logits = x2 @ p["Wlm"].T  # [B, T, VOCAB]
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        log_probs = shifted - log_norm
        picked = np.take_along_axis(log_probs, batch.targets[..., None], axis=-1)[..., 0]
        loss = -float((picked * batch.weight).sum())

        cache = dict(
            x0=x0, r0=r0, h1=h1, r1=r1, q=q, k=k, v=v, probs_att=probs_att, att=att,
            x1=x1, h2=h2, r2=r2, pre=pre, hidden=hidden, x2=x2, log_probs=log_probs,
        )
        return loss, cache

    # ---- backward -----------------------------------------------------------------------------------
    def backward(self, batch: Batch, c: dict[str, np.ndarray]) -> None:
        """Write d(loss)/d(params) into the gradient buffer (every element is overwritten)."""
        p, g = self.p, self.g
        b, t = batch.inputs.shape
        rows = b * t

        def flat(x: np.ndarray) -> np.ndarray:  # [B, T, n] -> [B*T, n] for weight gradients
            return x.reshape(rows, x.shape[-1])

        # Cross-entropy: d(loss)/d(logits) = (softmax - onehot(target)) * weight.
        dlogits = np.exp(c["log_probs"])
        flat(dlogits)[np.arange(rows), batch.targets.ravel()] -= 1
        dlogits *= batch.weight[..., None]
        np.matmul(flat(dlogits).T, flat(c["x2"]), out=g["Wlm"])
        dx2 = dlogits @ p["Wlm"]

        # FFN: x2 = x1 + Wf2 relu(Wf1 h2).
        np.matmul(flat(dx2).T, flat(c["hidden"]), out=g["Wf2"])
        dpre = (dx2 @ p["Wf2"]) * (c["pre"] > 0)
        np.matmul(flat(dpre).T, flat(c["h2"]), out=g["Wf1"])
        dx1 = dx2 + rms_norm_backward(dpre @ p["Wf1"], c["h2"], c["r2"])

        # Attention output projection: x1 = x0 + Wo att.
        np.matmul(flat(dx1).T, flat(c["att"]), out=g["Wo"])
        datt = _heads(dx1 @ p["Wo"], self.shape.n_heads)  # [B, H, T, head_dim]

        # Softmax attention: att = P v with P = softmax(scale * q k^T + mask).
        probs_att = c["probs_att"]
        dv = probs_att.swapaxes(-1, -2) @ datt
        dprobs = datt @ c["v"].swapaxes(-1, -2)
        dscores = probs_att * (dprobs - (dprobs * probs_att).sum(axis=-1, keepdims=True))
        dscores *= self.scale
        dq = dscores @ c["k"]
        dk = dscores.swapaxes(-1, -2) @ c["q"]

        # Q, K, V projections from h1 = rms(x0), all three at once through the [3D, D] view.
        dqkv = np.concatenate([_merge_heads(dq), _merge_heads(dk), _merge_heads(dv)], axis=-1)
        np.matmul(flat(dqkv).T, flat(c["h1"]), out=self.g_qkv)
        dx0 = dx1 + rms_norm_backward(dqkv @ self.p_qkv, c["h1"], c["r1"])

        # Embeddings: x0 = rms(tok_emb[tok] + pos_emb[t]). One-hot matmul sums rows sharing a token.
        demb = rms_norm_backward(dx0, c["x0"], c["r0"])
        onehot = np.zeros((rows, VOCAB), dtype=self.dtype)
        onehot[np.arange(rows), batch.inputs.ravel()] = 1
        np.matmul(onehot.T, flat(demb), out=g["tok_emb"])
        g["pos_emb"][:t] = demb.sum(axis=0)
        g["pos_emb"][t:] = 0

    def loss_and_grads(self, batch: Batch) -> float:
        loss, cache = self.forward(batch)
        self.backward(batch, cache)
        return loss


def train_step(
    model: StepModel, batch: Batch, params: np.ndarray, grads: np.ndarray, m: np.ndarray, v: np.ndarray,
    step: int, lr: float,
) -> float:
    """Forward, backward and one Adam update (the core's specification); returns the loss before it.

    `step` is the 1-based index of this update. On a non-finite loss nothing is updated.
    """
    loss = model.loss_and_grads(batch)
    if not np.isfinite(loss):
        raise FloatingPointError(f"non-finite loss ({loss}) at update {step}; parameters left unchanged")
    adam_update(params, grads, m, v, step, lr)
    return loss
