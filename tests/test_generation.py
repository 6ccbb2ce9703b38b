"""The generator: the float32 key/value-cache forward against the float64 reference, the window cropped past
the context as nanoGPT crops it, token choice (temperature, top-k, top-p), seeds, batches of bounded memory,
and text continuations through the Python API."""

from __future__ import annotations

import string
import tracemalloc
import warnings

import numpy as np
import pytest

from eemicrogpt_core.base.blas import blas_threads, one_blas_thread
from eemicrogpt_core.base.errors import ConfigError
from eemicrogpt_core.interface.api import Run
from eemicrogpt_core.model import generation
from eemicrogpt_core.model.choice import Choice, choose, probabilities
from eemicrogpt_core.model.generation import Continuation, batch_rows, row_bytes
from eemicrogpt_core.model.kvcache import CachedModel
from eemicrogpt_core.model.sampling import forward_logits, sample_names, text_continuations
from eemicrogpt_core.model.shape import ModelShape, init_params
from eemicrogpt_core.model.vocab import Vocabulary
from eemicrogpt_core.training.config import TrainConfig

NAMES = Vocabulary.names()
TEXT = Vocabulary(tuple(sorted("\n !,.:;?" + string.ascii_letters)), with_boundary=False)  # 60 symbols, no boundary
# Measured worst |float32 cache - float64 reference| / max |logit|: 1.4e-7 (d16, 2 layers), 4.3e-7 (d128,
# 4 layers, context 64), 2.8e-6 (d64, 8 layers, weights x4: larger activations, more rounding). The bound is
# 1e-5 of the largest logit: about 4x the worst seen, ~80 float32 epsilons; a wrong position, head or mask
# is off by whole units.
RELATIVE_TOLERANCE = 1e-5


def _shape(vocab: Vocabulary, d: int = 16, layers: int = 2, context: int = 12, heads: int = 4) -> ModelShape:
    return ModelShape(d, heads, n_layers=layers, vocab=vocab.size, context=context)


def _run(vocab: Vocabulary, shape: ModelShape, params: np.ndarray) -> Run:
    return Run(params, shape, vocab, TrainConfig(d_model=shape.d_model), None, 0, 1)


@pytest.mark.parametrize(("vocab", "d", "layers", "context", "scale"), [
    (NAMES, 16, 2, 12, 1.0), (TEXT, 16, 2, 12, 4.0), (TEXT, 128, 4, 64, 1.0), (TEXT, 64, 8, 32, 4.0)])
def test_cached_logits_equal_the_reference_past_the_context(vocab: Vocabulary, d: int, layers: int, context: int,
                                                            scale: float) -> None:
    shape = _shape(vocab, d, layers, context, heads=8 if d == 128 else 4)
    params = init_params(shape, seed=3) * np.float32(scale)
    seq = np.random.default_rng(1).integers(0, shape.vocab, (3, 2 * context + 5))
    run = Continuation(CachedModel(params, shape), seq[:, :2], slide=1)
    # the start, the window filling up, the first crops and the end (the float64 reference is the slow part)
    checked = {*range(2, 6), *range(context - 2, context + 4), seq.shape[1] - 1}
    for t in range(2, seq.shape[1]):
        if t in checked:  # nanoGPT's crop: the logits after token t - 1 are those of the last `context` tokens
            want = forward_logits(params, shape, seq[:, max(0, t - context) : t])[:, -1]
            assert run.logits.dtype == np.float32
            np.testing.assert_array_less(np.abs(run.logits - want), RELATIVE_TOLERANCE * np.abs(want).max())
        run.push(seq[:, t])


def test_a_sequence_prefilled_at_once_equals_one_grown_a_token_at_a_time() -> None:
    shape = _shape(TEXT, context=10)
    params = init_params(shape, seed=4)
    seq = np.random.default_rng(2).integers(0, shape.vocab, (2, 10))
    model = CachedModel(params, shape)
    whole = model.prefill(seq)
    model.prefill(seq[:, :1])
    for t in range(1, 10):
        grown = model.step(seq[:, t])
    np.testing.assert_allclose(grown, whole, rtol=0, atol=RELATIVE_TOLERANCE * np.abs(whole).max())
    with pytest.raises(ValueError, match="step needs"):
        model.step(seq[:, 0])  # the cache is full: the caller must crop and prefill


def _greedy_text_by_hand(params: np.ndarray, shape: ModelShape, tokens: list[int], new: int, slide: int) -> list[int]:
    """Greedy continuation with the float64 reference, the window kept as a plain list."""
    window, out = list(tokens[-shape.context :]), []
    for _ in range(new):
        out.append(int(forward_logits(params, shape, np.array([window]))[0, -1].argmax()))
        if len(window) == shape.context:
            window = window[slide:]  # slide 1: nanoGPT's crop to the last `context` tokens
        window.append(out[-1])
    return out


@pytest.mark.parametrize("slide", [1, 3, 8, None])
def test_greedy_text_past_the_context_follows_the_window(slide: int | None) -> None:
    shape = _shape(TEXT, context=8)
    params = init_params(shape, seed=5) * np.float32(4)  # sharp logits: no near-ties between float32 and 64
    prompt = "To be, or not to be"  # longer than the context: only its last 8 characters are read
    got = _run(TEXT, shape, params).generate(prompt, max_new_tokens=40, temperature=0, slide=slide)
    by_hand = 2 if slide is None else slide  # the default drops a quarter of the context
    want = _greedy_text_by_hand(params, shape, TEXT.encode(prompt), 40, by_hand)
    assert got == TEXT.decode(want) and len(got) == 40


def test_text_generation_is_seeded() -> None:
    shape = _shape(TEXT)
    run = _run(TEXT, shape, init_params(shape, seed=6))
    a = run.generate("ab", max_new_tokens=50, temperature=1.0, seed=7)
    assert a == run.generate("ab", max_new_tokens=50, temperature=1.0, seed=7)
    assert a != run.generate("ab", max_new_tokens=50, temperature=1.0, seed=8)
    assert len(a) == 50 and set(a) <= set(TEXT.symbols)
    fresh = {run.generate("ab", max_new_tokens=50, temperature=1.0) for _ in range(3)}
    assert len(fresh) == 3  # no seed: fresh entropy each call (a repeat has probability ~60^-50)


def test_several_continuations_come_in_batches_with_the_prompt_cropped(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = _shape(TEXT)
    params = init_params(shape, seed=6)

    def draw() -> list[str]:
        return ["".join(chars) for chars in text_continuations(params, shape, TEXT, "x" * 30, 20, 5, Choice(1.0), 1)]

    texts = draw()
    assert len(texts) == 5 and all(len(t) == 20 and set(t) <= set(TEXT.symbols) for t in texts)
    assert len(set(texts)) == 5
    monkeypatch.setattr(generation, "BATCH_BYTES", 2 * row_bytes(shape) + 2 * 8 * 20)  # two rows a batch
    assert batch_rows(shape, 20) == 2
    smaller = draw()  # three batches: the same rng drawn in other shapes gives other texts, all complete
    assert len(smaller) == 5 and all(len(t) == 20 for t in smaller) and smaller == draw()


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"prompt": "hé"}, "the prompt's character 'é' (U+00E9) is not in the model's vocabulary"),
    ({"prompt": ""}, "the prompt is empty"),
    ({"max_new_tokens": 0}, "max new tokens must be 1..1,000,000, got 0"),
    ({"max_new_tokens": 10**9}, "max new tokens must be 1..1,000,000"),
    ({"top_k": 0}, "top-k must be 1..60 (the model's vocabulary), got 0"),
    ({"top_k": 61}, "top-k must be 1..60"),
    ({"top_p": 0.0}, "top-p must be in (0, 1]"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"seed": -1}, "seed must be a whole number >= 0"),
    ({"slide": 0}, "slide must be 1..12 (the model's context), got 0"),
    ({"slide": 13}, "slide must be 1..12"),
])
def test_text_generation_refuses_bad_arguments(kwargs: dict, fragment: str) -> None:
    shape = _shape(TEXT)
    with pytest.raises(ConfigError) as info:
        _run(TEXT, shape, init_params(shape, seed=0)).generate(**kwargs)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_model_of_the_other_kind_is_refused_by_name() -> None:
    names_run = _run(NAMES, _shape(NAMES), init_params(_shape(NAMES), seed=0))
    with pytest.raises(ConfigError, match="trained on a list of names, not a text"):
        names_run.generate("ab")
    text_run = _run(TEXT, _shape(TEXT), init_params(_shape(TEXT), seed=0))
    with pytest.raises(ConfigError, match="trained on a text, not a list of names"):
        text_run.sample(3)


def test_run_sample_seeds_and_logits_bounds() -> None:
    shape = _shape(NAMES)
    run = _run(NAMES, shape, init_params(shape, seed=1))
    assert run.sample(20, temperature=1.0, seed=3) == run.sample(20, temperature=1.0, seed=3)
    assert run.sample(20, temperature=1.0) != run.sample(20, temperature=1.0)  # fresh names without a seed
    for seed in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="seed must be a whole number >= 0"):
            run.sample(2, seed=seed)  # type: ignore[arg-type]
    assert run.logits("a" * (shape.context - 1)).shape == (shape.context, shape.vocab)
    with pytest.raises(ConfigError, match=r"the text has 100 characters; the model reads 0\.\.11 at once"):
        run.logits("a" * 100)
    text_run = _run(TEXT, _shape(TEXT), init_params(_shape(TEXT), seed=0))
    assert text_run.logits("ab").shape == (2, TEXT.size)
    with pytest.raises(ConfigError, match=r"reads 1\.\.12 at once"):
        text_run.logits("")


def _reference_top_k_top_p(logits: np.ndarray, temperature: float, k: int | None, p: float | None) -> np.ndarray:
    """One row at a time, by sorting: keep the k best (ties with the k-th too), softmax, then the fewest best
    tokens whose mass reaches p."""
    out = np.zeros_like(logits, dtype=np.float64)
    for row, z in enumerate(logits.astype(np.float64)):
        keep = z >= np.sort(z)[-k] if k is not None else np.ones(z.size, bool)
        probs = np.where(keep, np.exp((z - z.max()) / temperature), 0.0)
        probs /= probs.sum()
        if p is not None:
            mass, kept = 0.0, np.zeros(z.size, bool)
            for i in sorted(range(z.size), key=lambda i: -probs[i]):
                if mass >= p:
                    break
                kept[i], mass = True, mass + probs[i]
            probs = np.where(kept, probs, 0.0) / probs[kept].sum()
        out[row] = probs
    return out


@pytest.mark.parametrize(("k", "p"), [(1, None), (5, None), (27, None), (None, 0.5), (None, 0.9), (8, 0.7)])
def test_top_k_and_top_p_against_a_reference(k: int | None, p: float | None) -> None:
    logits = np.random.default_rng(k or 0).normal(0, 2, (6, 27)).astype(np.float32)
    got = probabilities(logits, Choice(0.7, k, p))
    np.testing.assert_allclose(got, _reference_top_k_top_p(logits, 0.7, k, p), rtol=1e-12, atol=1e-15)
    if k is not None:
        assert ((got > 0).sum(axis=1) <= k).all()
    draws = np.stack([choose(logits, Choice(0.7, k, p), np.random.default_rng(s)) for s in range(200)])
    assert (np.take_along_axis(got, draws.T, axis=1) > 0).all()  # only kept tokens are ever drawn


def test_a_tiny_temperature_is_greedy_without_overflow() -> None:
    logits = np.random.default_rng(0).normal(0, 3, (50, 27)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow or invalid-value warnings fail the test
        for temperature in (5e-324, 1e-300, 1e-30):
            tokens = choose(logits, Choice(temperature), np.random.default_rng(1))
            assert np.array_equal(tokens, logits.argmax(axis=1))


def test_names_memory_does_not_grow_with_n(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = _shape(NAMES, d=32, context=16)
    monkeypatch.setattr(generation, "BATCH_BYTES", 2**20)
    rows = batch_rows(shape)
    assert rows * row_bytes(shape) <= 2**20 and rows >= 8
    params = init_params(shape, seed=0)

    def peak(n: int) -> int:
        tracemalloc.start()
        names = list(sample_names(params, shape, NAMES, n, Choice(1.0), seed=1))
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(names) == n
        return size

    small, large = peak(2 * rows), peak(40 * rows)
    # All at once, 40 batches' activations would need about 40 MiB; batched, the peak is one batch's plus the
    # names kept (about 100 bytes each).
    assert large < small + 200 * 40 * rows and large < 4 * 2**20


def test_the_issue_shapes_batch_within_the_bound() -> None:
    big = ModelShape(256, 8, n_layers=8, vocab=27, context=64)  # -n 3000 on this used to pass 4 GB
    assert CachedModel.cache_bytes(big, 1) == 8 * 2 * 64 * 256 * 4
    rows = batch_rows(big)
    assert rows >= 1 and rows * row_bytes(big) <= generation.BATCH_BYTES
    assert batch_rows(big, tokens_per_row=10**6) < rows  # text rows also hold their output


def test_generation_holds_blas_to_one_thread_and_gives_it_back() -> None:
    before = blas_threads()
    if not before:
        pytest.skip("numpy's BLAS here is not an OpenBLAS this process can find: nothing to hold")
    with one_blas_thread():
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before
