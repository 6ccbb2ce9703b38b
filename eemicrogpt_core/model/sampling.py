"""Generation from trained parameters: names from a list's model, continuations of a prompt from a text's.

Both go through the float32 key/value-cache forward (kvcache.py) in batches of bounded memory
(generation.py), so memory does not grow with the number of samples; the reference forward (float64) stays
here for logits a caller inspects (`forward_logits`). The vocabulary says which kind a model is: a list's
has a boundary token that starts and ends every name; a text's has none, so a continuation starts from its
prompt and runs for exactly the tokens asked, sliding its window past the context.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator

import numpy as np

from ..base.errors import ConfigError
from .choice import Choice
from .generation import batch_rows, continue_tokens, draw_items
from .kvcache import CachedModel
from .reference import StepModel, prefix_batch
from .shape import ModelShape
from .vocab import Vocabulary

MAX_UNIQUE_TRIES = 50  # rounds of drawing when `unique` asks for more distinct names than the model gives
# One cap for the API and the CLI. Work is batched, so these bound time and the output, not working memory:
# a million names of up to 64 characters, or a million characters of text per continuation.
MAX_SAMPLES = 1_000_000
MAX_NEW_TOKENS = 1_000_000
MAX_PROMPT_CHARS = 1_000_000  # only the last `context` characters are read; the bound keeps encoding cheap
NAMES_TEMPERATURE, TEXT_TEMPERATURE = 0.5, 0.8  # the defaults; the text's is nanoGPT's sample.py's
SUMMARY_TEXT_CHARS = 200  # the text sample summary_sample prints


def make_rng(seed: int | None) -> np.random.Generator:
    """A generator from a seed >= 0 (the same seed, the same samples) or, for None, fresh entropy."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ConfigError(f"seed must be a whole number >= 0 (or None for fresh samples), got {seed!r}")
    return np.random.default_rng(None if seed is None else int(seed))


def forward_logits(params: np.ndarray, shape: ModelShape, tokens: np.ndarray) -> np.ndarray:
    """Logits [N, T, vocab] for token prefixes [N, T] (T <= context), causal: row t sees tokens 0..t (float64)."""
    n, t = tokens.shape
    if not 1 <= t <= shape.context:
        raise ValueError(f"prefix length must be 1..{shape.context}, got {t}")
    model = StepModel(shape, np.array(params, dtype=np.float64))
    logits, _ = model.logits(prefix_batch(tokens))
    return logits.reshape(n, t, shape.vocab)


def _check_model(shape: ModelShape, vocab: Vocabulary, choice: Choice) -> None:
    if vocab.size != shape.vocab:
        raise ConfigError(f"the vocabulary has {vocab.size} tokens but the model {shape.vocab}")
    choice.check(vocab.size)


def _check_count(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_SAMPLES:
        raise ConfigError(f"number of {what} must be 1..{MAX_SAMPLES:,}, got {n!r}")


def sample_names(params: np.ndarray, shape: ModelShape, vocab: Vocabulary, n: int, choice: Choice,
                 seed: int | None = None, *, prefix: str = "", max_len: int | None = None,
                 unique: bool = False) -> Iterator[str]:
    """n names, yielded as each batch finishes, each starting with prefix and at most max_len characters long
    (default and upper bound: the context); the same seed gives the same names, None fresh ones. unique:
    distinct names, fewer than n when the model does not produce that many. Arguments are checked before the
    first name is drawn."""
    _check_count(n, "samples")
    _check_model(shape, vocab, choice)
    if not vocab.with_boundary:
        raise ConfigError("this model was trained on a text, not a list of names: continue a prompt instead")
    limit = shape.context
    max_len = limit if max_len is None else max_len
    if not 1 <= max_len <= limit:
        raise ConfigError(f"max length must be 1..{limit} (the model's context), got {max_len}")
    bad = vocab.unknown(prefix)
    if bad is not None:
        raise ConfigError(f"the prefix's character {bad!r} is not in the model's vocabulary")
    if len(prefix) >= max_len:
        raise ConfigError(f"the prefix has {len(prefix)} characters; it must be shorter than the max length {max_len}")
    rng = make_rng(seed)
    return _names(CachedModel(params, shape), vocab, n, choice, rng, prefix, max_len, unique)


def _names(model: CachedModel, vocab: Vocabulary, n: int, choice: Choice, rng: np.random.Generator, prefix: str,
           max_len: int, unique: bool) -> Iterator[str]:
    start = np.array([vocab.boundary, *vocab.encode(prefix)], dtype=np.int64)
    most = max_len - len(prefix)

    def batch(rows: int) -> list[str]:
        drawn = draw_items(model, np.tile(start, (rows, 1)), most, vocab.boundary, choice, rng)
        return [prefix + vocab.decode(row) for row in drawn]

    if choice.greedy:  # every draw is the same: one sequence is enough
        name = batch(1)[0]
        yield from [name] if unique else [name] * n
        return
    rows = batch_rows(model.shape)
    if not unique:
        for first in range(0, n, rows):
            yield from batch(min(rows, n - first))
        return
    seen: set[str] = set()
    for _ in range(MAX_UNIQUE_TRIES * -(-n // rows)):  # as many draws as MAX_UNIQUE_TRIES rounds of n
        for name in batch(min(rows, n)):
            if name not in seen:
                seen.add(name)
                yield name
                if len(seen) == n:
                    return


def generate(params: np.ndarray, shape: ModelShape, vocab: Vocabulary, n: int = 20, temperature: float = 0.5,
             seed: int | None = None, *, prefix: str = "", max_len: int | None = None, unique: bool = False,
             top_k: int | None = None, top_p: float | None = None) -> list[str]:
    """sample_names as a list (temperature 0: greedy; lower: more typical names)."""
    choice = Choice(temperature, top_k, top_p)
    return list(sample_names(params, shape, vocab, n, choice, seed, prefix=prefix, max_len=max_len, unique=unique))


def default_prompt(vocab: Vocabulary) -> str:
    """Where a text continuation starts when no prompt is given: a newline if the text has one, else its first
    symbol."""
    return "\n" if "\n" in vocab.symbols else vocab.symbols[0]


def prompt_tokens(vocab: Vocabulary, prompt: str) -> np.ndarray:
    """The prompt's tokens; a ConfigError for an empty or too long prompt or a character outside the vocabulary."""
    if not vocab.with_boundary and not prompt:
        raise ConfigError("the prompt is empty; a text model continues at least one character")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are read")
    bad = vocab.unknown(prompt)
    if bad is not None:
        raise ConfigError(f"the prompt's character {bad!r} (U+{ord(bad):04X}) is not in the model's vocabulary")
    return np.array(vocab.encode(prompt), dtype=np.int64)


def text_continuations(params: np.ndarray, shape: ModelShape, vocab: Vocabulary, prompt: str,
                       max_new_tokens: int, n: int, choice: Choice, seed: int | None = None,
                       slide: int | None = None) -> Iterator[Iterator[str]]:
    """n continuations of prompt, each max_new_tokens characters (the prompt not repeated), past the context
    by dropping `slide` characters of the window at a time (1: nanoGPT's crop to the last `context` before
    every character; None: a quarter of the context, generation.default_slide). Each continuation is an
    iterator of its characters, streamed as they are drawn when n is 1; for n > 1 continuations are drawn in
    batches of bounded memory and each one is complete when yielded. Arguments are checked before anything
    is drawn."""
    _check_count(n, "continuations")
    _check_model(shape, vocab, choice)
    if vocab.with_boundary:
        raise ConfigError("this model was trained on a list of names, not a text: sample names (with a prefix)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) \
            or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ConfigError(f"max new tokens must be 1..{MAX_NEW_TOKENS:,}, got {max_new_tokens!r}")
    if slide is not None and (isinstance(slide, bool) or not isinstance(slide, numbers.Integral)
                              or not 1 <= slide <= shape.context):
        raise ConfigError(f"slide must be 1..{shape.context} (the model's context), got {slide!r}")
    start = prompt_tokens(vocab, prompt)[-shape.context :]
    rng = make_rng(seed)
    return _texts(CachedModel(params, shape), vocab, start, int(max_new_tokens), n, choice, rng,
                  None if slide is None else int(slide))


def _texts(model: CachedModel, vocab: Vocabulary, start: np.ndarray, new: int, n: int, choice: Choice,
           rng: np.random.Generator, slide: int | None) -> Iterator[Iterator[str]]:
    symbols = vocab.symbols
    if n == 1:
        yield (symbols[int(tokens[0])] for tokens in continue_tokens(model, start[None], new, choice, rng, slide))
        return
    rows = batch_rows(model.shape, new)
    for first in range(0, n, rows):
        count = min(rows, n - first)
        out = np.empty((count, new), dtype=np.uint8)  # a vocabulary has at most 256 tokens
        for i, tokens in enumerate(continue_tokens(model, np.tile(start, (count, 1)), new, choice, rng,
                                                     slide)):
            out[:, i] = tokens
        for row in out:
            yield iter(vocab.decode(row))


def summary_sample(params: np.ndarray, shape: ModelShape, vocab: Vocabulary, seed: int) -> str:
    """The line `train` ends with (and prints every `sample_every` steps): ten names, or a short continuation
    of a text's default prompt."""
    if vocab.with_boundary:
        names = sample_names(params, shape, vocab, 10, Choice(NAMES_TEMPERATURE), seed)
        return "samples: " + ", ".join(names)
    prompt = default_prompt(vocab)
    (chars,) = text_continuations(params, shape, vocab, prompt, SUMMARY_TEXT_CHARS, 1, Choice(TEXT_TEMPERATURE), seed)
    return f"sample: {prompt + ''.join(chars)!r}"
