"""Names file -> token arrays, the seeded train/validation split and the seeded batch sampler.

Every backend receives identical batches for the same seed because all of them are prepared here.
A name is one line of the file, NFC-normalised, stripped of surrounding whitespace; its characters are
the vocabulary's symbols (vocab.py). Lines split on "\n" only (a U+2028 inside a name is a character).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.abi import LENGTH_DTYPE
from ..base.errors import DataError
from ..model.vocab import Vocabulary, _show
from .names_reader import read_name_lines

TRAIN_STREAM = 2  # seed streams: 1 is the split, 2 the training batches, others are free for tools
PAD = 0  # value of padding positions; backends never read them, a fixed value keeps inputs identical


@dataclass
class NameSet:
    """The names of a file after cleaning, with what was dropped on the way."""

    names: list[str]
    source: str
    n_dropped: int = 0  # lines dropped with drop_invalid (a control character, or outside a fixed vocabulary)
    sha256: str = ""  # of the file's bytes (read_names), the fingerprint checkpoints keep


@dataclass
class Dataset:
    """Encoded names: tokens uint8 [N, context + 1] and lengths uint16 [N] (2..context + 1)."""

    tokens: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def subset(self, index: np.ndarray) -> Dataset:
        return Dataset(self.tokens[index], self.lengths[index])

    def sampler(self, batch: int, seed: int, stream: int = TRAIN_STREAM) -> BatchSampler:
        return BatchSampler(self, batch, seed, stream)

    def batches(self, batch: int, max_batches: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Validation batches (the seed is not needed: the split already shuffled the names)."""
        return fixed_batches(self, batch, max_batches)

    def all_batches(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every name in order, `batch` a batch, the last batch possibly smaller (eval)."""
        return [(self.tokens[i : i + batch], self.lengths[i : i + batch]) for i in range(0, len(self), batch)]


def clean_name(raw: str, *, lowercase: bool = False) -> str:
    """One line as a name: surrounding whitespace removed, case folded only when asked (str.lower, which
    keeps ß as ß), then NFC-normalised (after folding: T + U+0308 lowercases to a pair NFC composes)."""
    name = raw.strip()
    return unicodedata.normalize("NFC", name.lower() if lowercase else name)


def clean_prefix(prefix: str, lowercase: bool) -> str:
    """A sampling prefix as the run's names were cleaned: NFC, folded when the run folded case (its inner
    and trailing spaces are kept: "new " starts a second word)."""
    return unicodedata.normalize("NFC", prefix.lower() if lowercase else prefix)


def _control_char(name: str) -> str | None:
    return next((ch for ch in name if unicodedata.category(ch) == "Cc"), None)


def parse_names(lines: list[str], source: str, *, drop_invalid: bool = False, lowercase: bool = False,
                vocab: Vocabulary | None = None) -> NameSet:
    """Clean lines: strip, skip blanks, NFC, optionally lowercase. Control characters (tab, NUL...) are
    refused, as are characters outside `vocab` when one is given (a resumed run's table); with drop_invalid
    such lines are skipped and counted instead."""
    names: list[str] = []
    dropped = 0
    for lineno, raw in enumerate(lines, start=1):
        name = clean_name(raw, lowercase=lowercase)
        if not name:
            continue
        bad = _control_char(name)
        problem = f"control character {_show(bad)}" if bad is not None else None
        if problem is None and vocab is not None:
            bad = vocab.unknown(name)
            if bad is not None:
                problem = f"character {bad!r} ({_show(bad)}) is not in the checkpoint's vocabulary"
        if problem is not None:
            if drop_invalid:
                dropped += 1
                continue
            raise DataError(f"{source}:{lineno}: {problem} (pass drop_invalid / --drop-invalid to skip such lines)")
        names.append(name)
    if not names:
        raise DataError(f"{source}: no names found (the file is empty or every line was dropped)")
    return NameSet(names, source, dropped)


def read_names(path: str | Path, *, drop_invalid: bool = False, lowercase: bool = False,
               vocab: Vocabulary | None = None) -> NameSet:
    """Read and clean a UTF-8 names file, one name per line (size and line length bounded: names_reader)."""
    read = read_name_lines(path)
    names = parse_names(read.lines, str(path), drop_invalid=drop_invalid, lowercase=lowercase, vocab=vocab)
    names.sha256 = read.sha256
    return names


def encode(names: list[str], vocab: Vocabulary, context: int) -> tuple[Dataset, int]:
    """[boundary] + symbols + [boundary], truncated to context + 1 tokens; padding positions hold PAD.

    Returns the dataset and how many names were truncated (their later characters are not predicted).
    """
    seq_len = context + 1
    tokens = np.full((len(names), seq_len), PAD, dtype=np.uint8)
    lengths = np.empty(len(names), dtype=LENGTH_DTYPE)
    truncated = 0
    b = vocab.boundary
    for i, name in enumerate(names):
        seq = [b, *vocab.encode(name), b]
        if len(seq) > seq_len:
            truncated += 1
            seq = seq[:seq_len]
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return Dataset(tokens, lengths), truncated


@dataclass
class Split:
    train: Dataset
    validation: Dataset | None  # None: no validation (val_fraction 0)
    note: str = ""  # one line when the split is not the plain one (too few names, or none asked for)


def split(data: Dataset, val_fraction: float, seed: int) -> Split:
    """Seeded shuffle, then the first ceil(val_fraction * N) names are validation.

    val_fraction 0: no validation. Too few names for the fraction (the held-out share would be over twice
    val_fraction, e.g. 1 to 4 names at 10%): the validation loss is measured on the training names, and the
    note says so."""
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = len(data)
    if val_fraction == 0.0:
        return Split(data, None, "no validation split (val_fraction 0): only the train loss is measured")
    n_val = int(np.ceil(val_fraction * n))
    # Too few to split: the held-out share would be more than twice the one asked for (2 names at 10% would
    # hold out half of them), or nothing would be left to train on.
    if n_val >= n or n_val > 2 * val_fraction * n:
        count = "1 name is" if n == 1 else f"{n:,} names are"
        return Split(data, data, f"{count} too few to split off {val_fraction:.0%} for validation: the "
                     "validation loss is measured on the training names")
    order = np.random.default_rng([seed, 1]).permutation(n)  # stream 1: independent of init and batches
    return Split(data.subset(order[n_val:]), data.subset(order[:n_val]))


class SeededSampler:
    """A batch sampler's seeded generator: its state is what a checkpoint keeps, so resumes are exact."""

    TRAIN_STREAM = TRAIN_STREAM

    def __init__(self, batch: int, seed: int, stream: int = TRAIN_STREAM) -> None:
        if batch < 1:
            raise DataError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        self.rng = np.random.default_rng([seed, stream])

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n batches: tokens uint8 [n, B, context + 1], lengths uint16 [n, B]."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        return dict(self.rng.bit_generator.state)

    def set_state(self, state: dict[str, Any]) -> None:
        problem = sampler_state_problem(state)
        if problem is None:
            try:
                self.rng.bit_generator.state = state
            except (TypeError, ValueError, KeyError, OverflowError) as e:
                problem = str(e)
        if problem is not None:
            raise DataError(f"invalid sampler state: {problem}")


class BatchSampler(SeededSampler):
    """Uniform sampling of names with replacement, as the seed."""

    def __init__(self, data: Dataset, batch: int, seed: int, stream: int = SeededSampler.TRAIN_STREAM) -> None:
        super().__init__(batch, seed, stream)
        self.data = data

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.rng.integers(0, len(self.data), size=(n, self.batch))
        return self.data.tokens[index], self.data.lengths[index]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sampler_state_problem(state: object) -> str | None:
    """None when `state` is a PCG64 state numpy accepts as given (every field typed and in range), else why not.

    numpy itself would truncate floats, raise OverflowError on huge numbers, or accept odd values silently.
    """
    if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
        return "expected a PCG64 generator state"
    inner = state.get("state")
    if not isinstance(inner, dict) or set(inner) != {"state", "inc"}:
        return "expected state.state and state.inc"
    if not all(_is_int(inner[k]) and 0 <= inner[k] < 2**128 for k in ("state", "inc")):
        return "state.state and state.inc must be integers in 0..2**128-1"
    if state.get("has_uint32") not in (0, 1) or isinstance(state.get("has_uint32"), bool):
        return "has_uint32 must be 0 or 1"
    if not (_is_int(state.get("uinteger")) and 0 <= state["uinteger"] < 2**32):
        return "uinteger must be an integer in 0..2**32-1"
    return None


def fixed_batches(data: Dataset, batch: int, max_batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Deterministic evaluation batches: the data in order, whole batches only (one short batch if tiny)."""
    n_batches = min(max_batches, len(data) // batch)
    if n_batches == 0:
        return [(data.tokens, data.lengths)]
    return [
        (data.tokens[i * batch : (i + 1) * batch], data.lengths[i * batch : (i + 1) * batch])
        for i in range(n_batches)
    ]
