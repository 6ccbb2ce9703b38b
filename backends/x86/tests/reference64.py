"""Test helpers: the float64 reference of the step (the core's eemicrogpt_core.model.reference), batches, errors.

Used by the x86 tests to check gradients at shapes and batch sizes beyond the conformance kit's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from eemicrogpt_core.base.abi import LENGTH_DTYPE
from eemicrogpt_core.model import reference
from eemicrogpt_core.model.shape import ModelShape, init_params


class Reference(NamedTuple):
    loss: float
    grads: np.ndarray
    # Smallest |ReLU input| over every layer: float32 and float64 may land on opposite sides of a kink closer
    # than ~1e-6, which legitimately changes the gradient; tests pick inputs whose margin is well above that.
    relu_margin: float


def loss_and_grads(shape: ModelShape, params: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> Reference:
    """Mean cross-entropy over live positions and its gradient, both in float64."""
    loss, grads, cache = reference.loss_and_grads(shape, params, tokens, lengths, np.float64)
    margin = min(float(np.abs(layer["pre"]).min()) for layer in cache["layers"])
    return Reference(loss, grads, margin)


def random_batch(rng: np.random.Generator, shape: ModelShape, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Name-like sequences of the shape's vocabulary: boundary, symbols, boundary, then arbitrary in-vocabulary
    padding; the first row is a full context (the longest attention), the rest have random lengths."""
    seq, boundary = shape.seq_len, shape.boundary
    tokens = rng.integers(0, shape.vocab, size=(batch, seq), dtype=np.uint8)
    lengths = rng.integers(2, seq + 1, size=batch).astype(LENGTH_DTYPE)
    lengths[0] = seq
    for b, n in enumerate(lengths):
        tokens[b, 0] = boundary
        tokens[b, 1 : n - 1] = rng.integers(0, boundary, size=n - 2)
        tokens[b, n - 1] = boundary
    return tokens, lengths


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    """Root-mean-square of a - b relative to the root-mean-square of b."""
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


class ClearInputs(NamedTuple):
    params: np.ndarray
    tokens: np.ndarray
    lengths: np.ndarray
    loss: float
    grads: np.ndarray


def clear_inputs(shape: ModelShape, batch: int) -> ClearInputs:
    """The first seeded (params x 1.5, batch) whose ReLU inputs all keep clear of the kink (> 10x fp32
    error), with their float64 loss and gradient."""
    for seed in range(20):
        params = init_params(shape, seed) * np.float32(1.5)
        tokens, lengths = random_batch(np.random.default_rng(seed), shape, batch)
        ref = loss_and_grads(shape, params, tokens, lengths)
        if ref.relu_margin > 1e-6:
            return ClearInputs(params, tokens, lengths, ref.loss, ref.grads)
    raise AssertionError(f"no inputs clear of the ReLU kink for {shape.describe()} batch {batch}")
