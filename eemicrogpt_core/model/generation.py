"""Token generation over the key/value cache: batches of bounded memory, and the window past the context.

Positions are learned embeddings, so once the window is full, moving it moves every token to a new position
and nothing of the cache can be kept. nanoGPT's sample.py crops the window to the last `context` tokens
before every new token (slide 1 here): each token past the context then costs one full forward of `context`
positions instead of one position, about 90 MFLOP a character at d128/4 layers/context 64 (a few hundred
characters a second on one core). So by default (`default_slide`) a full window drops a quarter of its
tokens at once and grows one cached position at a time again: one full forward of three quarters of the
window per context/4 tokens, and each token is predicted from between 3/4 of the context plus one and the
whole context.
benchmarks/generate_speed.py measures both. BLAS runs on one thread meanwhile (base/blas.py): these matrices
are too small to share.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..base.blas import one_blas_thread
from .choice import Choice, choose
from .kvcache import CachedModel
from .shape import ModelShape

BATCH_BYTES = 64 * 2**20  # the working memory of one batch of sequences growing together
MAX_BATCH_ROWS = 1024  # above this the per-step numpy overhead is already amortised
SLIDE_SHARE = 4  # the default slide drops context // SLIDE_SHARE tokens when the window is full


def default_slide(context: int) -> int:
    """The tokens a full window drops at once unless told otherwise: a quarter of the context (at least 1)."""
    return max(1, context // SLIDE_SHARE)


def row_bytes(shape: ModelShape) -> int:
    """Bytes one sequence of a batch needs: its cache and a full window's activations (a prefill)."""
    c, d = shape.context, shape.d_model
    activations = 4 * c * (3 * d + 4 * d + 3 * d) + 4 * 2 * shape.n_heads * c * c
    return CachedModel.cache_bytes(shape, 1) + activations


def batch_rows(shape: ModelShape, tokens_per_row: int = 0) -> int:
    """How many sequences one batch holds within BATCH_BYTES, each also keeping tokens_per_row output tokens."""
    per_row = row_bytes(shape) + 8 * tokens_per_row
    return int(max(1, min(MAX_BATCH_ROWS, BATCH_BYTES // per_row)))


class Continuation:
    """n sequences growing together from a common start: `logits` are the next token's, `push` appends one;
    past the context `slide` tokens leave the window at a time (1: crop before every token; None:
    default_slide)."""

    def __init__(self, model: CachedModel, start: np.ndarray, slide: int | None = None) -> None:
        self.model = model
        self.context = model.shape.context
        slide = default_slide(self.context) if slide is None else slide
        if not 1 <= slide <= self.context:
            raise ValueError(f"slide must be 1..{self.context}, got {slide}")
        self.slide = slide
        self.window = np.ascontiguousarray(start[:, -self.context :], dtype=np.int64)
        self.logits = model.prefill(self.window)

    def push(self, tokens: np.ndarray) -> None:
        if self.window.shape[1] < self.context:
            self.window = np.concatenate([self.window, tokens[:, None]], axis=1)
            self.logits = self.model.step(tokens)
        else:  # drop the oldest `slide` tokens: every position moves, so the whole window runs again
            self.window = np.concatenate([self.window[:, self.slide :], tokens[:, None]], axis=1)
            self.logits = self.model.prefill(self.window)

    def keep(self, rows: np.ndarray) -> None:
        self.window = self.window[rows]
        self.logits = self.logits[rows]
        self.model.keep(rows)


def continue_tokens(model: CachedModel, start: np.ndarray, new: int, choice: Choice, rng: np.random.Generator,
                    slide: int | None = None) -> Iterator[np.ndarray]:
    """The next `new` tokens [n] of every row of start [n, t], one array per step."""
    with one_blas_thread():
        run = Continuation(model, start, slide)
        for i in range(new):
            tokens = choose(run.logits, choice, rng)
            yield tokens
            if i + 1 < new:
                run.push(tokens)


def draw_items(model: CachedModel, start: np.ndarray, most: int, stop: int, choice: Choice,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of start [n, t] continued until each emits the `stop` token or has `most` new tokens: the new
    tokens of each row, the stop token left out. Finished rows leave the batch once a quarter have
    finished, so long stragglers do not carry the rest."""
    with one_blas_thread():
        out = _draw_until(model, start, most, stop, choice, rng)
    return [row[: int(np.argmax(row == stop)) if (row == stop).any() else most] for row in out]


def _draw_until(model: CachedModel, start: np.ndarray, most: int, stop: int, choice: Choice,
                rng: np.random.Generator) -> np.ndarray:
    n = start.shape[0]
    out = np.full((n, most), stop, dtype=np.int64)
    rows = np.arange(n)  # output row of each sequence still in the batch
    done = np.zeros(n, dtype=bool)
    run = Continuation(model, start)
    for i in range(most):
        tokens = choose(run.logits, choice, rng)
        tokens[done] = stop
        out[rows, i] = tokens
        done |= tokens == stop
        if done.all() or i + 1 == most:
            break
        if done.mean() > 0.25:
            live = np.flatnonzero(~done)
            run.keep(live)
            rows, tokens, done = rows[live], tokens[live], done[live]
        run.push(tokens)
    return out
