"""A text file as one stream of characters: bounded reading, its vocabulary, the split and the window sampler.

The characters are Unicode code points after NFC (case kept unless asked to fold); a newline is a symbol
like any other. The vocabulary is the text's distinct characters with no boundary token, so each is one
uint8 token and the whole text one uint8 array. As nanoGPT splits shakespeare_char, the first
1 - val_fraction of the characters train and the rest validate. A training batch is `batch` windows of
context + 1 characters at seeded random offsets of the training part (every position predicts the next
character); validation and `eval` read consecutive windows, so every character after the first is predicted
exactly once.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.abi import LENGTH_DTYPE, MAX_VOCAB
from ..base.errors import DataError
from ..model.vocab import Vocabulary, _show
from .names import SeededSampler
from .names_reader import open_bounded

# 256 MiB of UTF-8: tiny Shakespeare (1.1 MB) 240 times over, enwik8 (100 MB) twice. Reading keeps one byte
# per character and, while the parts are joined at the end, a second copy: about 2 bytes per character at peak.
MAX_TEXT_BYTES = 256 << 20
CHUNK_BYTES = 1 << 20
VALIDATION_STREAM = 4  # seed streams: 2 training batches, 3 the time-budget warm-up (trainer), 4 validation


@dataclass
class Text:
    """A text's tokens (uint8, one per character) and its vocabulary."""

    tokens: np.ndarray
    vocab: Vocabulary
    source: str
    sha256: str = ""  # of the file's bytes, the fingerprint checkpoints keep


def _too_big(path: Path, size: str, max_bytes: int) -> DataError:
    return DataError(f"{path}: {size}, more than a text may hold ({max_bytes:,} bytes, read into memory at about "
                     "2 bytes per character); train on a part of it")


def _safe_cut(text: str) -> int:
    """Where text can be cut so that NFC and case folding of the two parts equal those of the whole: before its
    last ASCII character (no composition ends in one), or nowhere (0) when it has none."""
    for i in range(len(text) - 1, 0, -1):
        if text[i] < "\x80":
            return i
    return 0


class _Encoder:
    """Characters -> uint8 tokens. With a fixed vocabulary (a resumed or evaluated run's) a character outside it
    is an error; otherwise tokens are provisional ids in order of first appearance, sorted at the end."""

    def __init__(self, source: str, vocab: Vocabulary | None) -> None:
        self.source = source
        self.fixed = vocab
        seen = [ord(ch) for ch in vocab.symbols] if vocab is not None else []
        self.points = np.array(seen, dtype=np.uint32)  # code points, sorted
        self.ids = np.arange(len(seen), dtype=np.uint8)  # their token (provisional without a fixed vocabulary)
        self.count = 0  # characters encoded so far

    def encode(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        new = np.setdiff1d(np.unique(points), self.points, assume_unique=True)
        if new.size:
            if self.fixed is not None:
                at = self.count + int(np.argmax(np.isin(points, new)))
                ch = chr(int(points[at - self.count]))
                raise DataError(f"{self.source}: character {ch!r} ({_show(ch)}) at character {at:,} is not in the "
                                "run's vocabulary")
            if len(self.points) + new.size > MAX_VOCAB:
                raise DataError(f"{self.source}: more than {MAX_VOCAB} distinct characters; a text's vocabulary "
                                "holds at most that many (fold case with --lowercase, or remove rare characters)")
            ids = np.concatenate([self.ids, np.arange(len(self.points), len(self.points) + new.size)])
            points_all = np.concatenate([self.points, new])
            order = np.argsort(points_all)
            self.points, self.ids = points_all[order], ids[order].astype(np.uint8)
        self.count += points.size
        return self.ids[np.searchsorted(self.points, points)]

    def finish(self, parts: list[np.ndarray]) -> tuple[np.ndarray, Vocabulary]:
        tokens = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
        if self.fixed is not None:
            return tokens, self.fixed
        if not self.points.size:
            raise DataError(f"{self.source}: the text is empty (no characters to train on)")
        # Provisional id -> rank of its code point, so tokens follow the vocabulary's code-point order.
        rank = np.empty(len(self.ids), dtype=np.uint8)
        rank[self.ids] = np.arange(len(self.ids), dtype=np.uint8)
        tokens = rank[tokens]
        return tokens, Vocabulary(tuple(chr(int(p)) for p in self.points), with_boundary=False)


def read_text(path: str | Path, *, lowercase: bool = False, vocab: Vocabulary | None = None,
              max_bytes: int | None = None) -> Text:
    """The file's characters as tokens, read in chunks of CHUNK_BYTES: UTF-8 (a leading BOM dropped), case folded
    when asked (str.lower), NFC. DataError when the file is missing, larger than max_bytes, not UTF-8, empty,
    has more than 256 distinct characters, or (with `vocab`) a character outside it. max_bytes: MAX_TEXT_BYTES
    unless given."""
    max_bytes = MAX_TEXT_BYTES if max_bytes is None else max_bytes
    path = Path(path)
    fd = open_bounded(path, "text file", max_bytes, lambda size: _too_big(path, size, max_bytes))
    source = str(path)
    encoder = _Encoder(source, vocab)
    decoder = codecs.getincrementaldecoder("utf-8-sig")()  # drops a leading byte-order mark (Windows editors)
    digest = hashlib.sha256()
    parts: list[np.ndarray] = []
    pending = ""  # decoded characters held back until a safe cut (_safe_cut)
    total = 0
    try:
        while True:
            try:
                chunk = os.read(fd, CHUNK_BYTES)
            except OSError as e:
                raise DataError(f"cannot read text file {path}: {e.strerror or e}") from None
            if total + len(chunk) > max_bytes:  # a device, pipe or growing file: its size was not known up front
                raise _too_big(path, f"more than {max_bytes:,} bytes", max_bytes)
            digest.update(chunk)
            held = len(decoder.getstate()[0])
            try:
                pending += decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not valid UTF-8 at byte {total - held + e.start:,} "
                                f"({e.object[e.start]:#04x})") from None
            total += len(chunk)
            cut = _safe_cut(pending) if chunk else len(pending)
            if cut:
                piece = pending[:cut].lower() if lowercase else pending[:cut]
                parts.append(encoder.encode(unicodedata.normalize("NFC", piece)))
                pending = pending[cut:]
            if not chunk:
                break
    finally:
        os.close(fd)
    tokens, vocab = encoder.finish(parts)
    if not tokens.size:
        raise DataError(f"{source}: the text is empty (no characters to train on)")
    return Text(tokens, vocab, source, digest.hexdigest())


@dataclass
class TextPart:
    """A stretch of a text's tokens that windows of context + 1 characters are cut from."""

    tokens: np.ndarray  # uint8 [n]
    context: int

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def n_windows(self) -> int:
        """Full windows: one per offset 0..n - context - 1."""
        return max(0, len(self) - self.context)

    def sampler(self, batch: int, seed: int, stream: int = SeededSampler.TRAIN_STREAM) -> WindowSampler:
        return WindowSampler(self, batch, seed, stream)

    def batches(self, batch: int, max_batches: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Validation: consecutive windows (every character after the first predicted once), all of them when
        they fit in max_batches batches, else a seeded choice of that many kept in order."""
        offsets = validation_offsets(len(self), self.context, max_batches * batch, seed)
        return windows_in_batches(self.tokens, offsets, self.context, batch)


def validation_offsets(n: int, context: int, keep: int, seed: int) -> np.ndarray:
    """The consecutive windows' offsets (consecutive_offsets), or a seeded choice of `keep` of them in order."""
    offsets = consecutive_offsets(n, context)
    if offsets.size <= keep:
        return offsets
    chosen = np.random.default_rng([seed, VALIDATION_STREAM]).choice(offsets.size, keep, replace=False)
    return offsets[np.sort(chosen)]


def consecutive_offsets(n: int, context: int) -> np.ndarray:
    """Starts of the windows that tile n characters: each predicts `context` characters, the last may be shorter
    (it needs two characters: one to see, one to predict)."""
    return np.arange(0, max(n - 1, 0), context, dtype=np.int64)


def windows_in_batches(tokens: np.ndarray, offsets: np.ndarray, context: int,
                       batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows of context + 1 tokens from each offset (cut short at the text's end, padded with 0), `batch` rows a
    batch, the last batch possibly smaller."""
    seq_len = context + 1
    padded = np.concatenate([tokens, np.zeros(seq_len, np.uint8)])
    rows = padded[offsets[:, None] + np.arange(seq_len)]
    lengths = np.minimum(seq_len, tokens.size - offsets).astype(LENGTH_DTYPE)
    return [(rows[i : i + batch], lengths[i : i + batch]) for i in range(0, len(offsets), batch)]


class WindowSampler(SeededSampler):
    """`batch` windows of context + 1 characters at uniform random offsets (with replacement); every offset
    0..n - context - 1 is possible, so the text's last character is reachable."""

    def __init__(self, part: TextPart, batch: int, seed: int, stream: int = SeededSampler.TRAIN_STREAM) -> None:
        super().__init__(batch, seed, stream)
        if part.n_windows < 1:
            raise DataError(f"{len(part):,} characters hold no window of {part.context + 1} characters")
        self.part = part
        self._steps = np.arange(part.context + 1)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n batches: tokens uint8 [n, B, context + 1], lengths uint16 [n, B] (every row full)."""
        offsets = self.rng.integers(0, self.part.n_windows, size=(n, self.batch))
        tokens = self.part.tokens[offsets[..., None] + self._steps]
        return tokens, np.full((n, self.batch), self.part.context + 1, dtype=LENGTH_DTYPE)

    def offsets(self, n: int) -> np.ndarray:
        """The offsets the next `n` batches would use, without drawing them (for tests and tools)."""
        saved: dict[str, Any] = self.get_state()
        drawn = self.rng.integers(0, self.part.n_windows, size=(n, self.batch))
        self.set_state(saved)
        return drawn


@dataclass
class TextSplit:
    train: TextPart
    validation: TextPart | None
    at: int  # the first validation character (len of the text without validation)


def split_text(text: Text, context: int, val_fraction: float) -> TextSplit:
    """The first int(n * (1 - val_fraction)) characters train, the rest validate (nanoGPT's split); each part
    must hold a window of context + 1 characters (validation none at val_fraction 0)."""
    n, window = int(text.tokens.size), context + 1
    if n < window:
        raise DataError(f"{text.source}: the text has {n:,} characters, fewer than one window of context + 1 = "
                        f"{window} (lower --context, or give a longer text)")
    at = int(n * (1.0 - val_fraction))
    if at < window:
        raise DataError(f"{text.source}: the training part ({at:,} of {n:,} characters) is shorter than one window "
                        f"of {window}; lower --val-fraction ({val_fraction:g}) or --context")
    if val_fraction == 0.0:
        return TextSplit(TextPart(text.tokens, context), None, n)
    if n - at < window:
        raise DataError(f"{text.source}: --val-fraction {val_fraction:g} leaves {n - at:,} characters for "
                        f"validation, fewer than one window of {window}; raise it (or 0 for no validation)")
    return TextSplit(TextPart(text.tokens[:at], context), TextPart(text.tokens[at:], context), at)
