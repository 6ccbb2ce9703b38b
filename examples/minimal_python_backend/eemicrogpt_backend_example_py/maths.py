"""The model's forward and backward pass, one sequence at a time, written for reading rather than speed.

Everything here follows docs/writing-a-backend.md; the shapes and the parameter layout come from the core
(`eemicrogpt_core.model.shape`). microgpt's loop, no biases, weights stored W[out][in] so y = x @ W.T:

    x = rms(tok_emb[token] + pos_emb[t])
    per layer:  h1 = rms(x);  q, k, v = h1 Wq^T, h1 Wk^T, h1 Wv^T
                x = x + causal_attention(q, k, v) Wo^T          (per head, scores scaled by 1/sqrt(head_dim))
                h2 = rms(x);  x = x + relu(h2 Wf1^T) Wf2^T
    logits = x Wlm^T;  loss = mean over every live position of the batch of -log softmax(logits)[next token]

rms(x) = x / sqrt(mean(x^2) + RMS_EPS), no gain. A sequence of length L has L - 1 live positions: position t
reads token t and predicts token t + 1. Tokens past L are padding and never read.
"""

from __future__ import annotations

import numpy as np

from eemicrogpt_core.model.shape import LAYER_TENSORS, RMS_EPS, ModelShape, layer_tensor, views


def rms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(RMS_EPS))
    return x * r, r


def rms_backward(dy: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
    return r * (dy - y * np.mean(dy * y, axis=-1, keepdims=True))


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """[P, D] -> [H, P, head_dim]."""
    return x.reshape(x.shape[0], n_heads, -1).transpose(1, 0, 2)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """[H, P, head_dim] -> [P, D]."""
    return x.transpose(1, 0, 2).reshape(x.shape[1], -1)


def loss_and_grads(
    shape: ModelShape, params: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool
) -> tuple[float, np.ndarray | None]:
    """Mean loss over the batch's live positions and, if wanted, its gradient (flat, in the layout's order)."""
    p = views(shape, params)
    grads = np.zeros_like(params)
    g = views(shape, grads)
    n_live = int(lengths.astype(np.int64).sum()) - len(lengths)
    total = 0.0
    for seq, length in zip(tokens, lengths, strict=True):
        total += _sequence(shape, p, g if want_grads else None, seq[: int(length)].astype(np.intp), n_live)
    return total / n_live, (grads if want_grads else None)


def _layer_forward(shape: ModelShape, w: dict, x0: np.ndarray, future: np.ndarray) -> dict:
    """One layer on one sequence's positions; returns what its backward pass needs (and its output, "out")."""
    scale = x0.dtype.type(1.0 / np.sqrt(shape.head_dim))
    h1, r1 = rms(x0)
    q, k, v = (split_heads(h1 @ w[name].T, shape.n_heads) for name in ("Wq", "Wk", "Wv"))
    scores = np.where(future, -np.inf, (q @ k.transpose(0, 2, 1)) * scale)
    att = np.exp(scores - scores.max(axis=-1, keepdims=True))
    att /= att.sum(axis=-1, keepdims=True)
    mixed = merge_heads(att @ v)
    x1 = x0 + mixed @ w["Wo"].T
    h2, r2 = rms(x1)
    pre = h2 @ w["Wf1"].T
    hidden = np.maximum(pre, 0)
    return dict(h1=h1, r1=r1, q=q, k=k, v=v, att=att, mixed=mixed, h2=h2, r2=r2, pre=pre, hidden=hidden,
                out=x1 + hidden @ w["Wf2"].T)


def _layer_backward(shape: ModelShape, w: dict, gw: dict, c: dict, dout: np.ndarray) -> np.ndarray:
    """Given d(loss)/d(layer output), add the layer's weight gradients to gw; returns d(loss)/d(its input)."""
    scale = dout.dtype.type(1.0 / np.sqrt(shape.head_dim))
    gw["Wf2"] += dout.T @ c["hidden"]
    dpre = (dout @ w["Wf2"]) * (c["pre"] > 0)
    gw["Wf1"] += dpre.T @ c["h2"]
    dx1 = dout + rms_backward(dpre @ w["Wf1"], c["h2"], c["r2"])
    gw["Wo"] += dx1.T @ c["mixed"]
    dmixed = split_heads(dx1 @ w["Wo"], shape.n_heads)
    att = c["att"]
    dv = att.transpose(0, 2, 1) @ dmixed
    datt = dmixed @ c["v"].transpose(0, 2, 1)
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) * scale
    dq, dk = dscores @ c["k"], dscores.transpose(0, 2, 1) @ c["q"]
    dh1 = np.zeros_like(c["h1"])
    for name, d in (("Wq", dq), ("Wk", dk), ("Wv", dv)):
        d = merge_heads(d)
        gw[name] += d.T @ c["h1"]
        dh1 += d @ w[name]
    return dx1 + rms_backward(dh1, c["h1"], c["r1"])


def _sequence(shape: ModelShape, p: dict, g: dict | None, seq: np.ndarray, n_live: int) -> float:
    """Forward (and backward into g) for one sequence; returns its summed loss."""
    n_pos, dtype = len(seq) - 1, p["tok_emb"].dtype
    inputs, targets = seq[:-1], seq[1:]
    future = np.triu(np.ones((n_pos, n_pos), dtype=bool), k=1)
    layers = [{name: p[layer_tensor(i, name)] for name in LAYER_TENSORS} for i in range(shape.n_layers)]

    x0, r0 = rms(p["tok_emb"][inputs] + p["pos_emb"][:n_pos])
    caches, x = [], x0
    for w in layers:
        caches.append(_layer_forward(shape, w, x, future))
        x = caches[-1]["out"]
    logits = x @ p["Wlm"].T
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = -float(log_probs[np.arange(n_pos), targets].astype(np.float64).sum())
    if g is None:
        return loss

    # Backward: d(mean loss)/d(logits) = (softmax - onehot(target)) / n_live, then the chain rule upwards.
    dlogits = np.exp(log_probs)
    dlogits[np.arange(n_pos), targets] -= 1
    dlogits *= dtype.type(1.0 / n_live)
    g["Wlm"] += dlogits.T @ x
    dx = dlogits @ p["Wlm"]
    for i in reversed(range(shape.n_layers)):
        grads = {name: g[layer_tensor(i, name)] for name in LAYER_TENSORS}
        dx = _layer_backward(shape, layers[i], grads, caches[i], dx)
    demb = rms_backward(dx, x0, r0)
    np.add.at(g["tok_emb"], inputs, demb)
    g["pos_emb"][:n_pos] += demb
    return loss
