"""A second, independent implementation of microgpt's loop in float64, for checking the reference.

Written from the ABI header's description (eemicrogpt_core/include/eemicrogpt.h), sharing no code with
eemicrogpt_core: its own parameter layout, its own forward pass, and gradients from a scalar reverse-mode
autodiff (as microgpt.py computes them), so no hand-written backward pass is shared with reference.py
either. Python floats are IEEE float64. It runs position by position, one scalar at a time: slow, so only
for tiny shapes.

The model, per sequence, position by position (t predicts token t + 1):
    x = rms(tok_emb[tok[t]] + pos_emb[t])
    per layer: x = x + Wo attn(rms(x));  x = x + Wf2 relu(Wf1 rms(x))
    logits = Wlm x                            (no final norm)
with rms(x) = x / sqrt(mean(x^2) + 1e-5) (no gain) and causal attention over the positions so far, per
head, scaled by 1/sqrt(d_model / n_heads). The loss is the mean cross-entropy over the live positions of
the batch: t <= lengths[b] - 2 in sequence b.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

RMS_EPS = 1e-5
LAYER_TENSORS = ("Wq", "Wk", "Wv", "Wo", "Wf1", "Wf2")


@dataclass(frozen=True)
class LoopShape:
    d_model: int
    n_heads: int
    n_layers: int
    vocab: int
    context: int

    def tensors(self) -> list[tuple[str, int, int]]:
        """(name, rows, cols) of every tensor, in the header's order: tok_emb, pos_emb, per layer Wq Wk Wv
        Wo Wf1 Wf2, Wlm; each row-major W[out][in]."""
        d, f = self.d_model, 4 * self.d_model
        per_layer = {"Wq": (d, d), "Wk": (d, d), "Wv": (d, d), "Wo": (d, d), "Wf1": (f, d), "Wf2": (d, f)}
        out = [("tok_emb", self.vocab, d), ("pos_emb", self.context, d)]
        for layer in range(self.n_layers):
            out += [(f"layer{layer}.{name}", *per_layer[name]) for name in LAYER_TENSORS]
        return [*out, ("Wlm", self.vocab, d)]

    def slices(self) -> dict[str, slice]:
        """Where each tensor lies in the flat buffer."""
        out, start = {}, 0
        for name, rows, cols in self.tensors():
            out[name] = slice(start, start + rows * cols)
            start += rows * cols
        return out

    @property
    def n_params(self) -> int:
        return sum(rows * cols for _, rows, cols in self.tensors())


# ---- a scalar reverse-mode autodiff: each node keeps its inputs and d(node)/d(input) -----------------------
class Value:
    __slots__ = ("data", "grad", "inputs", "local_grads")

    def __init__(self, data: float, inputs: tuple[Value, ...] = (), local_grads: tuple[float, ...] = ()):
        self.data = data
        self.grad = 0.0
        self.inputs = inputs
        self.local_grads = local_grads

    def __add__(self, other: Value | float) -> Value:
        if isinstance(other, Value):
            return Value(self.data + other.data, (self, other), (1.0, 1.0))
        return Value(self.data + other, (self,), (1.0,))

    def __sub__(self, other: Value | float) -> Value:
        if isinstance(other, Value):
            return Value(self.data - other.data, (self, other), (1.0, -1.0))
        return Value(self.data - other, (self,), (1.0,))

    def __mul__(self, other: Value | float) -> Value:
        if isinstance(other, Value):
            return Value(self.data * other.data, (self, other), (other.data, self.data))
        return Value(self.data * other, (self,), (other,))

    def __truediv__(self, other: Value) -> Value:
        return Value(self.data / other.data, (self, other), (1.0 / other.data, -self.data / other.data**2))

    def exp(self) -> Value:
        e = math.exp(self.data)
        return Value(e, (self,), (e,))

    def log(self) -> Value:
        return Value(math.log(self.data), (self,), (1.0 / self.data,))

    def rsqrt(self) -> Value:
        r = 1.0 / math.sqrt(self.data)
        return Value(r, (self,), (-0.5 * r / self.data,))

    def relu(self) -> Value:
        return Value(max(self.data, 0.0), (self,), (1.0 if self.data > 0 else 0.0,))

    def backward(self) -> None:
        """Fill .grad of every node this one depends on with d(self)/d(node)."""
        # A node goes into `order` only after every node it depends on (iterative depth-first post-order:
        # the graphs are far deeper than Python's recursion limit).
        order: list[Value] = []
        visited: set[int] = set()
        stack: list[tuple[Value, bool]] = [(self, False)]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                order.append(node)
            elif id(node) not in visited:
                visited.add(id(node))
                stack.append((node, True))
                stack.extend((child, False) for child in node.inputs if id(child) not in visited)
        self.grad = 1.0
        for node in reversed(order):  # every node after all the nodes that use it
            for child, local in zip(node.inputs, node.local_grads, strict=True):
                child.grad += local * node.grad


def total(values: Sequence[Value]) -> Value:
    """sum(values) as one node."""
    return Value(math.fsum(v.data for v in values), tuple(values), (1.0,) * len(values))


def dot(a: Sequence[Value], b: Sequence[Value]) -> Value:
    """sum(a[i] * b[i]) as one node."""
    data = math.fsum(x.data * y.data for x, y in zip(a, b, strict=True))
    return Value(data, (*a, *b), (*(y.data for y in b), *(x.data for x in a)))


# ---- the model -----------------------------------------------------------------------------------------
Matrix = list[list[Value]]


def linear(w: Matrix, x: list[Value]) -> list[Value]:
    """y[o] = sum_i W[o][i] x[i]."""
    return [dot(row, x) for row in w]


def rms(x: list[Value]) -> list[Value]:
    scale = (dot(x, x) * (1.0 / len(x)) + RMS_EPS).rsqrt()
    return [xi * scale for xi in x]


def softmax(scores: list[Value]) -> list[Value]:
    top = max(s.data for s in scores)  # a constant shift: leaves the result and its gradient unchanged
    exps = [(s - top).exp() for s in scores]
    norm = total(exps)
    return [e / norm for e in exps]


def attention(q: list[Value], keys: list[list[Value]], values: list[list[Value]], n_heads: int) -> list[Value]:
    """Causal attention of one position over keys/values of positions 0..t (itself included), per head."""
    head_dim = len(q) // n_heads
    scale = 1.0 / math.sqrt(head_dim)
    out: list[Value] = []
    for h in range(n_heads):
        part = slice(h * head_dim, (h + 1) * head_dim)
        weights = softmax([dot(q[part], k[part]) * scale for k in keys])
        for j in range(part.start, part.stop):
            out.append(dot(weights, [v[j] for v in values]))
    return out


def unflatten(shape: LoopShape, flat: np.ndarray) -> dict[str, Matrix]:
    """One Value per parameter, as named matrices of rows."""
    if flat.shape != (shape.n_params,):
        raise ValueError(f"expected {shape.n_params} parameters, got shape {flat.shape}")
    out: dict[str, Matrix] = {}
    start = 0
    for name, rows, cols in shape.tensors():
        out[name] = [[Value(float(flat[start + r * cols + c])) for c in range(cols)] for r in range(rows)]
        start += rows * cols
    return out


def sequence_losses(shape: LoopShape, w: dict[str, Matrix], tokens: Sequence[int]) -> list[Value]:
    """The cross-entropy at each position of one sequence (tokens: its live inputs and the last target)."""
    keys: list[list[list[Value]]] = [[] for _ in range(shape.n_layers)]  # per layer, every position so far
    values: list[list[list[Value]]] = [[] for _ in range(shape.n_layers)]
    losses = []
    for t in range(len(tokens) - 1):
        x = rms([a + b for a, b in zip(w["tok_emb"][tokens[t]], w["pos_emb"][t], strict=True)])
        for layer in range(shape.n_layers):
            lw = {name: w[f"layer{layer}.{name}"] for name in LAYER_TENSORS}
            h = rms(x)
            keys[layer].append(linear(lw["Wk"], h))
            values[layer].append(linear(lw["Wv"], h))
            att = attention(linear(lw["Wq"], h), keys[layer], values[layer], shape.n_heads)
            x = [a + b for a, b in zip(x, linear(lw["Wo"], att), strict=True)]
            hidden = [u.relu() for u in linear(lw["Wf1"], rms(x))]
            x = [a + b for a, b in zip(x, linear(lw["Wf2"], hidden), strict=True)]
        logits = linear(w["Wlm"], x)
        top = max(v.data for v in logits)
        log_norm = total([(v - top).exp() for v in logits]).log()
        losses.append(log_norm - (logits[tokens[t + 1]] - top))
    return losses


def loss_and_grad(
    shape: LoopShape, params: np.ndarray, tokens: np.ndarray, lengths: Iterable[int]
) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the batch's live positions and its gradient, flat in the header's layout.

    tokens [B][context + 1], lengths [B] in [2, context + 1]; tokens past a sequence's length are not read.
    """
    w = unflatten(shape, np.asarray(params, dtype=np.float64))
    losses = []
    for row, length in zip(np.asarray(tokens), lengths, strict=True):
        if not 2 <= int(length) <= shape.context + 1:
            raise ValueError(f"length {length} outside [2, {shape.context + 1}]")
        losses += sequence_losses(shape, w, [int(tok) for tok in row[: int(length)]])
    loss = total(losses) * (1.0 / len(losses))
    loss.backward()
    grads = np.array([value.grad for name, _, _ in shape.tensors() for row in w[name] for value in row])
    return loss.data, grads
