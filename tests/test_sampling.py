"""The inference forward pass and seeded generation."""

from __future__ import annotations

import numpy as np
import pytest

from eemicrogpt_core.backend import TrainState
from eemicrogpt_core.data import encode
from eemicrogpt_core.errors import ConfigError
from eemicrogpt_core.model import MAX_SEQ, VOCAB, ModelShape, init_params
from eemicrogpt_core.registry import load_registry, open_session
from eemicrogpt_core.sampling import forward_logits, generate

SHAPE = ModelShape(16, 4)


def _cross_entropy(logits: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> float:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    terms = [-logp[b, t, tokens[b, t + 1]] for b in range(len(lengths)) for t in range(lengths[b] - 1)]
    return float(np.mean(terms))


def test_forward_matches_numpy_ref_loss() -> None:
    entry = load_registry().get("numpy_ref")
    assert entry is not None and entry.available, "numpy_ref must be installed (pip install ./backends/numpy_ref)"
    shape = ModelShape(32, 4)
    params = init_params(shape, seed=5)
    data, _ = encode(["emma", "olivia", "ava", "isabella", "sophia", "x" * 20])
    with open_session(entry, shape, len(data), "float64") as session:
        session.set_state(TrainState.fresh(params.astype(np.float64)))
        expected, _ = session.loss_and_grads(data.tokens, data.lengths, want_grads=False)
    got = _cross_entropy(forward_logits(params, shape, data.tokens.astype(np.int64)), data.tokens, data.lengths)
    assert got == pytest.approx(expected, rel=1e-9)


def test_forward_is_causal() -> None:
    params = init_params(SHAPE, seed=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(3, MAX_SEQ))
    changed = tokens.copy()
    changed[:, 9:] = (changed[:, 9:] + 1) % VOCAB
    a, b = forward_logits(params, SHAPE, tokens), forward_logits(params, SHAPE, changed)
    assert np.array_equal(a[:, :9], b[:, :9])
    assert not np.allclose(a[:, 9:], b[:, 9:])
    assert a.shape == (3, MAX_SEQ, VOCAB)


def test_generate_is_seeded_and_well_formed() -> None:
    params = init_params(SHAPE, seed=2)
    names = generate(params, SHAPE, n=50, temperature=1.0, seed=3)
    assert names == generate(params, SHAPE, n=50, temperature=1.0, seed=3)
    assert names != generate(params, SHAPE, n=50, temperature=1.0, seed=4)
    assert len(names) == 50
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz") and len(n) <= MAX_SEQ - 1 for n in names)


def test_zero_parameters_sample_uniformly() -> None:
    # All logits are 0, so every first token is uniform over the 27 tokens (the boundary ends the name).
    names = generate(np.zeros(SHAPE.n_params, np.float32), SHAPE, n=2700, temperature=1.0, seed=0)
    first = [n[0] if n else "" for n in names]
    counts = np.array([first.count(c) for c in [*"abcdefghijklmnopqrstuvwxyz", ""]])
    assert counts.min() > 60 and counts.max() < 140  # expected 100 each


def test_bad_arguments() -> None:
    params = init_params(SHAPE, seed=0)
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        generate(params, SHAPE, n=2, temperature=0.0)
    with pytest.raises(ConfigError, match="number of samples must be >= 1"):
        generate(params, SHAPE, n=0)
