"""The inference forward pass and seeded generation through a vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from eemicrogpt_core.backends.backend import TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.data.names import encode
from eemicrogpt_core.model.sampling import forward_logits, generate
from eemicrogpt_core.model.shape import ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary

VOCAB = Vocabulary.from_names(["Zoë -♀", "abc"])  # 9 symbols: ' ', '-', 'Z', 'a', 'b', 'c', 'o', 'ë', '♀'
SHAPE = ModelShape(16, 4, n_layers=2, vocab=VOCAB.size, context=12)


def _cross_entropy(logits: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> float:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    terms = [-logp[b, t, tokens[b, t + 1]] for b in range(len(lengths)) for t in range(lengths[b] - 1)]
    return float(np.mean(terms))


@pytest.mark.parametrize("shape", [ModelShape(32, 4), ModelShape(16, 4, n_layers=2, vocab=VOCAB.size, context=5)])
def test_forward_matches_numpy_ref_loss(shape: ModelShape) -> None:
    entry = load_registry().get("numpy_ref")
    assert entry is not None and entry.available, "numpy_ref must be installed (pip install ./backends/numpy_ref)"
    vocab = Vocabulary.names() if shape.vocab == 27 else VOCAB
    params = init_params(shape, seed=5)
    words = ["emma", "olivia", "ava", "isabella", "sophia", "x" * 20] if shape.vocab == 27 else \
        ["Zoë", "a-b ♀", "", "cab", "Zoë Zoë Zoë"]
    data, _ = encode(words, vocab, shape.context)
    with open_session(entry, shape, len(data), "float64") as session:
        session.set_state(TrainState.fresh(params.astype(np.float64)))
        expected, _ = session.loss_and_grads(data.tokens, data.lengths, want_grads=False)
    prefixes = data.tokens[:, : shape.context].astype(np.int64)  # the inputs; the last token is only a target
    got = _cross_entropy(forward_logits(params, shape, prefixes), data.tokens, data.lengths)
    assert got == pytest.approx(expected, rel=1e-9)


def test_forward_is_causal() -> None:
    params = init_params(SHAPE, seed=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SHAPE.vocab, size=(3, SHAPE.context))
    changed = tokens.copy()
    changed[:, 9:] = (changed[:, 9:] + 1) % SHAPE.vocab
    a, b = forward_logits(params, SHAPE, tokens), forward_logits(params, SHAPE, changed)
    assert np.array_equal(a[:, :9], b[:, :9])
    assert not np.allclose(a[:, 9:], b[:, 9:])
    assert a.shape == (3, SHAPE.context, SHAPE.vocab)
    with pytest.raises(ValueError, match="prefix length"):
        forward_logits(params, SHAPE, np.zeros((1, SHAPE.context + 1), np.int64))


def test_generate_is_seeded_and_uses_the_vocabulary() -> None:
    params = init_params(SHAPE, seed=2)
    names = generate(params, SHAPE, VOCAB, n=50, temperature=1.0, seed=3)
    assert names == generate(params, SHAPE, VOCAB, n=50, temperature=1.0, seed=3)
    assert names != generate(params, SHAPE, VOCAB, n=50, temperature=1.0, seed=4)
    assert len(names) == 50
    assert all(set(n) <= set(VOCAB.symbols) and len(n) <= SHAPE.context for n in names)
    used = set("".join(names))
    assert {"ë", "♀", " "} & used and len(used) >= 6  # at init the model spreads over its symbols


def test_zero_parameters_sample_uniformly() -> None:
    # All logits are 0, so every first token is uniform over the vocabulary (the boundary ends the name).
    v = VOCAB.size
    names = generate(np.zeros(SHAPE.n_params, np.float32), SHAPE, VOCAB, n=100 * v, temperature=1.0, seed=0,
                     max_len=1)
    first = [n[0] if n else "" for n in names]
    counts = np.array([first.count(c) for c in [*VOCAB.symbols, ""]])
    assert counts.min() > 60 and counts.max() < 140  # expected 100 each (binomial sd 9.5: bounds at ~4 sd)


def _greedy_by_hand(params: np.ndarray, shape: ModelShape, start: list[int], max_len: int) -> list[int]:
    seq = list(start)
    while len(seq) <= max_len:
        nxt = int(forward_logits(params, shape, np.array([seq]))[0, -1].argmax())
        seq.append(nxt)
        if nxt == shape.boundary:
            break
    return seq


def test_temperature_zero_is_greedy_and_ignores_the_seed() -> None:
    params = init_params(SHAPE, seed=7) * np.float32(4)  # sharper logits than at init: no near-ties
    names = generate(params, SHAPE, VOCAB, n=5, temperature=0, seed=0)
    assert names == generate(params, SHAPE, VOCAB, n=5, temperature=0, seed=123)
    assert len(set(names)) == 1 and len(names) == 5
    want = VOCAB.decode(_greedy_by_hand(params, SHAPE, [VOCAB.boundary], SHAPE.context)[1:])
    assert names[0] == want
    assert generate(params, SHAPE, VOCAB, n=5, temperature=0, unique=True) == [want]


def test_prefix_is_respected() -> None:
    params = init_params(SHAPE, seed=3)
    names = generate(params, SHAPE, VOCAB, n=40, temperature=1.0, seed=1, prefix="Zo")
    assert len(names) == 40 and all(n.startswith("Zo") for n in names)
    assert len({n[2:] for n in names}) > 5  # the continuations vary
    start = [VOCAB.boundary, *VOCAB.encode("Zo")]
    greedy = generate(params * np.float32(4), SHAPE, VOCAB, n=1, temperature=0, prefix="Zo")[0]
    assert greedy == VOCAB.decode(_greedy_by_hand(params * np.float32(4), SHAPE, start, SHAPE.context)[1:])


@pytest.mark.parametrize("max_len", [1, 3, 12])
def test_max_len_is_respected(max_len: int) -> None:
    # zero parameters: each token is uniform, so without the bound names run long
    params = np.zeros(SHAPE.n_params, np.float32)
    names = generate(params, SHAPE, VOCAB, n=60, temperature=1.0, seed=2, max_len=max_len)
    assert max(len(n) for n in names) == max_len
    prefix = "a" if max_len > 1 else ""
    with_prefix = generate(params, SHAPE, VOCAB, n=50, temperature=1.0, seed=2, max_len=max_len, prefix=prefix)
    assert all(len(n) <= max_len and n.startswith(prefix) for n in with_prefix)


def test_default_max_len_is_the_context() -> None:
    params = np.zeros(SHAPE.n_params, np.float32)
    names = generate(params, SHAPE, VOCAB, n=60, temperature=1.0, seed=5)
    assert max(len(n) for n in names) == SHAPE.context  # P(no boundary in 12 draws) = (9/10)^12: ~28% of names


def test_unique_gives_distinct_names() -> None:
    params = init_params(SHAPE, seed=4)
    names = generate(params, SHAPE, VOCAB, n=30, temperature=1.0, seed=0, unique=True)
    assert len(names) == 30 and len(set(names)) == 30
    # A one-symbol vocabulary with names of at most 2 letters has 3 names to give: "", "a", "aa".
    tiny = Vocabulary(("a",))
    shape = ModelShape(16, 4, vocab=tiny.size, context=4)
    few = generate(np.zeros(shape.n_params, np.float32), shape, tiny, n=10, temperature=1.0, max_len=2, unique=True)
    assert sorted(few) == ["", "a", "aa"]


def test_bad_arguments() -> None:
    params = init_params(SHAPE, seed=0)
    for temperature in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="temperature must be a finite number >= 0"):
            generate(params, SHAPE, VOCAB, n=2, temperature=temperature)
    with pytest.raises(ConfigError, match=r"number of samples must be 1\.\.1,000,000, got 0"):
        generate(params, SHAPE, VOCAB, n=0)
    with pytest.raises(ConfigError, match="vocabulary has 27 tokens but the model 10"):
        generate(params, SHAPE, Vocabulary.names())
    with pytest.raises(ConfigError, match="prefix's character 'x'"):
        generate(params, SHAPE, VOCAB, prefix="Zox")
    with pytest.raises(ConfigError, match=r"max length must be 1\.\.12"):
        generate(params, SHAPE, VOCAB, max_len=13)
    with pytest.raises(ConfigError, match=r"max length must be 1\.\.12"):
        generate(params, SHAPE, VOCAB, max_len=0)
    with pytest.raises(ConfigError, match="prefix has 2 characters"):
        generate(params, SHAPE, VOCAB, prefix="Zo", max_len=2)
