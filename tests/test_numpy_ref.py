"""numpy_ref on its own: exact gradients (1 to 4 layers, other vocabularies and contexts), padding, shapes,
Adam, training, and its plugin registration. The reference against an independent loop over layers is
tests/test_reference_layers.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from eemicrogpt_backend_numpy.session import NumpySession
from eemicrogpt_backend_numpy.step import Adam

from eemicrogpt_core.backends.backend import BackendSession, TrainState
from eemicrogpt_core.backends.registry import load_registry, open_session
from eemicrogpt_core.base.errors import NonFiniteError
from eemicrogpt_core.kit.conformance import load_names, make_batches, synthetic_batches
from eemicrogpt_core.model.optim import DEFAULT_OPTIMIZER, OptimizerSettings, adam_update, lr_schedule
from eemicrogpt_core.model.shape import NAMES_VOCAB, ModelShape, init_params, layer_tensor, views
from eemicrogpt_core.model.vocab import Vocabulary

NAMES = Vocabulary.names()
BOUNDARY = NAMES.boundary
Z = 25  # the letter z: used only as padding in the hand-made batch below


def encode(names: list[str], pad: int = Z, context: int = 16) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.full((len(names), context + 1), pad, np.uint8)
    lengths = np.empty(len(names), np.uint16)
    for i, name in enumerate(names):
        seq = [BOUNDARY, *NAMES.encode(name), BOUNDARY]
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return tokens, lengths


def session(shape: ModelShape, dtype: str, params: np.ndarray) -> NumpySession:
    s = NumpySession(shape, 64, dtype)
    s.set_state(TrainState.fresh(params))
    return s


def loss_at(shape: ModelShape, params: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> float:
    loss, _ = session(shape, "float64", params).loss_and_grads(tokens, lengths, want_grads=False)
    return loss


GRADIENT_SHAPES = [
    ModelShape(16, 4),
    ModelShape(24, 3),
    ModelShape(32, 8),
    ModelShape(16, 4, n_layers=2, vocab=6, context=5),
    ModelShape(16, 2, n_layers=4, vocab=40, context=9),
]


def _batch_for(shape: ModelShape, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The hand-made names batch at the seed's shape, else the kit's synthetic names of that vocabulary (their
    lengths run from 0 letters to past the context)."""
    if (shape.vocab, shape.context) == (NAMES_VOCAB, 16):
        return encode(["emma", "ava", "", "isabella", "bob"])
    tokens, lengths = synthetic_batches(shape, 1, 5, seed)
    return tokens[0], lengths[0]


@pytest.mark.parametrize("shape", GRADIENT_SHAPES, ids=lambda s: s.describe())
def test_float64_gradients_match_central_differences(shape: ModelShape) -> None:
    params = init_params(shape, 3).astype(np.float64) * 1.5
    tokens, lengths = _batch_for(shape)
    _, grads = session(shape, "float64", params).loss_and_grads(tokens, lengths)
    assert grads is not None and grads.dtype == np.float64
    rng = np.random.default_rng(0)
    eps = 1e-5
    for name in shape.tensor_names:
        start = shape.offsets[name]
        size = math.prod(shape.tensor_shapes[name])
        tensor = grads[start : start + size]
        picks = [start + int(np.argmax(np.abs(tensor))), *(start + rng.choice(size, 6, replace=False))]
        for i in picks:
            plus, minus = params.copy(), params.copy()
            plus[i] += eps
            minus[i] -= eps
            numeric = (loss_at(shape, plus, tokens, lengths) - loss_at(shape, minus, tokens, lengths)) / (2 * eps)
            # Relative to the tensor's largest gradient: near-zero entries are compared absolutely.
            assert abs(numeric - grads[i]) <= 1e-6 * np.max(np.abs(tensor)) + 1e-10, (name, i, numeric, grads[i])


def test_every_layer_has_its_own_weights() -> None:
    """Each layer's tensors get their own gradient (a layer reusing layer 0's weights would give equal ones)."""
    shape = ModelShape(16, 4, n_layers=3, vocab=6, context=5)
    tokens, lengths = _batch_for(shape, seed=1)
    _, grads = session(shape, "float64", init_params(shape, 2).astype(np.float64)).loss_and_grads(tokens, lengths)
    g = views(shape, grads)
    for name in ("Wq", "Wf2"):
        per_layer = [g[layer_tensor(layer, name)] for layer in range(3)]
        assert all(t.any() for t in per_layer)
        assert not np.allclose(per_layer[0], per_layer[1]) and not np.allclose(per_layer[1], per_layer[2])


def test_unused_embeddings_get_exactly_zero_gradient() -> None:
    shape = ModelShape(16)
    params = init_params(shape, 4)
    tokens, lengths = encode(["anna", "bo", "eve"])  # longest live prefix: positions 0..4
    _, grads = session(shape, "float32", params).loss_and_grads(tokens, lengths)
    g = views(shape, grads)
    assert not g["pos_emb"][5:].any() and g["pos_emb"][:5].all(axis=1).all()
    used = {0, 1, 4, 13, 14, 21, BOUNDARY}  # a b e n o v, boundary; z sits in the padding only
    unused = sorted(set(range(NAMES.size)) - used)
    assert not g["tok_emb"][unused].any()
    assert g["tok_emb"][sorted(used - {BOUNDARY})].any(axis=1).all()


@pytest.mark.parametrize("shape", [ModelShape(32), ModelShape(16, 4, n_layers=2, vocab=6, context=5)],
                         ids=lambda s: s.describe())
def test_padding_tokens_change_nothing(shape: ModelShape) -> None:
    params = init_params(shape, 5)
    if shape.vocab == NAMES.size:
        tokens, lengths = make_batches(load_names().names, 3, 16, seed=8)
    else:
        tokens, lengths = synthetic_batches(shape, 3, 16, seed=8)
    other = tokens.copy()
    rng = np.random.default_rng(1)
    dead = np.arange(tokens.shape[-1]) >= lengths[..., None]
    other[dead] = rng.integers(0, shape.vocab, int(dead.sum()))
    assert (other != tokens).any()
    lrs = np.full(3, 0.01, np.float32)
    runs = []
    for toks in (tokens, other):
        s = session(shape, "float32", params)
        loss, grads = s.loss_and_grads(toks[0], lengths[0])
        losses = s.train_steps(toks, lengths, lrs)
        runs.append((loss, grads, losses, s.get_state().params))
    (l1, g1, t1, p1), (l2, g2, t2, p2) = runs
    assert l1 == l2
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(p1, p2)


@pytest.mark.parametrize("shape,expected", [
    (ModelShape(16), 4_192), (ModelShape(32), 14_528), (ModelShape(64), 53_632), (ModelShape(128), 205_568),
    (ModelShape(64, 4, n_layers=2, vocab=64, context=32), 2 * 64 * 64 + 32 * 64 + 2 * 12 * 64 * 64),
    (ModelShape(16, 4, n_layers=8, vocab=256, context=64), 2 * 256 * 16 + 64 * 16 + 8 * 12 * 16 * 16),
])
def test_parameter_count(shape: ModelShape, expected: int) -> None:
    state = NumpySession(shape, 16).get_state()
    assert shape.n_params == expected
    assert state.params.shape == state.adam_m.shape == state.adam_v.shape == (expected,)
    assert state.step == 0


@pytest.mark.parametrize("d_model", [16, 32])
def test_loss_at_init_is_near_uniform(d_model: int) -> None:
    shape = ModelShape(d_model)
    tokens, lengths = make_batches(load_names().names, 1, 64, seed=2)
    loss = loss_at(shape, init_params(shape, 0).astype(np.float64), tokens[0], lengths[0])
    assert abs(loss - math.log(NAMES.size)) < 0.15, loss


def test_zero_lm_head_gives_exactly_uniform_loss() -> None:
    shape = ModelShape(64)
    params = init_params(shape, 0).astype(np.float64)
    views(shape, params)["Wlm"][:] = 0
    tokens, lengths = make_batches(load_names().names, 1, 16, seed=3)
    assert loss_at(shape, params, tokens[0], lengths[0]) == pytest.approx(math.log(NAMES.size), abs=1e-12)


def test_short_training_run_learns_names(names_file) -> None:
    shape = ModelShape(16)
    names = load_names(str(names_file))
    tokens, lengths = make_batches(names.names, 200, 16, seed=0)
    s = session(shape, "float32", init_params(shape, 0))
    losses = s.train_steps(tokens, lengths, lr_schedule(1, 200, 200, 0.01))
    assert losses[0] > 3.2
    assert losses[-20:].mean() < 2.6, losses[-20:].mean()
    assert s.get_state().step == 200


def test_float32_agrees_with_float64() -> None:
    shape = ModelShape(32)
    params = init_params(shape, 6) * np.float32(1.5)
    tokens, lengths = make_batches(load_names().names, 1, 16, seed=4)
    l32, g32 = session(shape, "float32", params).loss_and_grads(tokens[0], lengths[0])
    l64, g64 = session(shape, "float64", params).loss_and_grads(tokens[0], lengths[0])
    assert g32 is not None and g64 is not None and g32.dtype == np.float32
    assert abs(l32 - l64) < 1e-5 * l64
    assert np.sqrt(np.mean((g32 - g64) ** 2)) < 1e-5 * np.sqrt(np.mean(g64**2))


# The gradient below has a norm near sqrt(5000) = 71: a clip of 5 engages, one of 1e6 does not.
OPTIMIZERS = {
    "default": DEFAULT_OPTIMIZER,
    "clip": OptimizerSettings(grad_clip=5.0),
    "clip_idle": OptimizerSettings(grad_clip=1e6),
    "decay": OptimizerSettings(weight_decay=0.3),
    "moments": OptimizerSettings(beta1=0.9, beta2=0.95, eps=1e-4),
    "all": OptimizerSettings(beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip=1.0),
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_in_place_adam_is_bit_identical_to_the_spec(dtype: type, opt: str) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    params, grads, m = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    v = rng.random(n).astype(dtype)
    mine = [params.copy(), m.copy(), v.copy()]
    adam = Adam(n, np.dtype(dtype))
    adam.opt = OPTIMIZERS[opt]
    for step, lr in ((1, np.float32(0.01)), (2, np.float32(0.007)), (40, np.float32(0.003))):
        adam_update(params, grads, m, v, step, lr, OPTIMIZERS[opt])
        adam.update(mine[0], grads.copy(), mine[1], mine[2], step, lr)  # a copy: clipping scales it in place
    for got, want in zip(mine, (params, m, v), strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_default_optimizer_is_the_original_adam() -> None:
    """The spec's default path is the formula every earlier run used (constants of ABI version 2), to the bit."""
    rng = np.random.default_rng(3)
    params, grads, m = (rng.standard_normal(1000).astype(np.float32) for _ in range(3))
    v = rng.random(1000).astype(np.float32)
    want = [params.copy(), m.copy(), v.copy()]
    adam_update(params, grads, m, v, 7, np.float32(0.01))
    p, m0, v0 = want
    m0 *= 0.85
    m0 += (1.0 - 0.85) * grads
    v0 *= 0.99
    v0 += (1.0 - 0.99) * grads * grads
    p -= (np.float32(0.01) * (m0 / (1.0 - 0.85**7)) / (np.sqrt(v0 / (1.0 - 0.99**7)) + 1e-8)).astype(np.float32)
    for got, old in zip((params, m, v), (p, m0, v0), strict=True):
        np.testing.assert_array_equal(got, old)


def test_set_optimizer_reaches_the_update_and_refuses_bad_values() -> None:
    shape = ModelShape(16)
    tokens, lengths = make_batches(load_names().names, 3, 8, seed=5)
    lrs = lr_schedule(1, 3, 3, 0.01)
    start = init_params(shape, 1)
    runs = {}
    for name in ("default", "all"):
        s = session(shape, "float32", start)
        s.set_optimizer(OPTIMIZERS[name])
        s.train_steps(tokens, lengths, lrs)
        runs[name] = s.get_state().params
    plain = session(shape, "float32", start)
    plain.train_steps(tokens, lengths, lrs)
    np.testing.assert_array_equal(runs["default"], plain.get_state().params)
    assert not np.array_equal(runs["all"], runs["default"])
    with pytest.raises(ValueError, match=r"optimiser beta2 must be in \[0, 1\) \(as a float32\), got 1.0"):
        session(shape, "float32", start).set_optimizer(OptimizerSettings(beta2=1.0))


def test_many_steps_in_one_call_equal_one_step_per_call() -> None:
    shape = ModelShape(16)
    tokens, lengths = make_batches(load_names().names, 4, 8, seed=5)
    lrs = lr_schedule(1, 4, 4, 0.01)
    together = session(shape, "float32", init_params(shape, 1))
    one_by_one = session(shape, "float32", init_params(shape, 1))
    all_losses = together.train_steps(tokens, lengths, lrs)
    single = [one_by_one.train_steps(tokens[i : i + 1], lengths[i : i + 1], lrs[i : i + 1])[0] for i in range(4)]
    np.testing.assert_array_equal(all_losses, single)
    np.testing.assert_array_equal(together.get_state().params, one_by_one.get_state().params)
    assert together.get_state().step == 4


def test_state_keeps_the_session_dtype() -> None:
    shape = ModelShape(16)
    params64 = init_params(shape, 0).astype(np.float64) + 1e-12  # not representable in float32
    s64 = session(shape, "float64", params64)
    assert s64.get_state().params.dtype == np.float64
    np.testing.assert_array_equal(s64.get_state().params, params64)
    assert session(shape, "float32", params64).get_state().params.dtype == np.float32


def test_non_finite_loss_raises_and_leaves_state_alone() -> None:
    shape = ModelShape(16)
    params = init_params(shape, 0)
    views(shape, params)["Wlm"][3, 0] = np.inf
    s = session(shape, "float32", params)
    tokens, lengths = make_batches(load_names().names, 1, 4, seed=6)
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        s.train_steps(tokens, lengths, np.full(1, 0.01, np.float32))
    assert s.get_state().step == 0
    np.testing.assert_array_equal(s.get_state().params, params)


def test_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="float16"):
        NumpySession(ModelShape(16), 16, "float16")


def test_set_state_rejects_wrong_size() -> None:
    s = NumpySession(ModelShape(16), 16)
    short = TrainState.fresh(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match=r"params must have shape \(4192,\)"):
        s.set_state(short)


def test_registered_through_entry_point() -> None:
    entry = load_registry().get("numpy_ref")
    assert entry is not None, "pip install -e backends/numpy_ref registers the entry point"
    assert entry.available and entry.score == 1 and entry.distribution == "eemicrogpt-backend-numpy"
    assert entry.spec is not None and entry.spec.dtypes == ("float32", "float64")
    assert entry.spec.unsupported_reason(ModelShape(48, 6), 4096, "float64") is None
    for shape in (ModelShape(16, 4, n_layers=8, vocab=256, context=64), ModelShape(80, 4, n_layers=2, vocab=2,
                                                                                 context=1)):
        assert entry.spec.unsupported_reason(shape, 16, "float32") is None, shape
    assert "float16" in (entry.spec.unsupported_reason(ModelShape(16), 16, "float16") or "")
    with open_session(entry, ModelShape(16), 16) as validated:
        assert isinstance(validated.inner, NumpySession) and isinstance(validated.inner, BackendSession)
        tokens, lengths = make_batches(load_names().names, 1, 16, seed=9)
        loss, grads = validated.loss_and_grads(tokens[0], lengths[0])
    assert 3.0 < loss < 3.6 and grads is not None
