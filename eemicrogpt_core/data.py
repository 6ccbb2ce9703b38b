"""Names file -> token arrays, the seeded train/validation split and the seeded batch sampler.

Every backend receives identical batches for the same seed because all of them are prepared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .model import BOUNDARY, MAX_SEQ
from .names_reader import read_name_lines

PAD = 0  # value of padding positions; backends never read them, a fixed value keeps inputs identical
_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz")


@dataclass
class NameSet:
    """The names of a file after cleaning, with what was dropped on the way."""

    names: list[str]
    source: str
    n_dropped: int = 0  # lines with a character outside a-z (only with drop_invalid=True)
    sha256: str = ""  # of the file's bytes (read_names), the fingerprint checkpoints keep


@dataclass
class Dataset:
    """Encoded names: tokens uint8 [N, MAX_SEQ] and lengths uint8 [N] (2..MAX_SEQ)."""

    tokens: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def subset(self, index: np.ndarray) -> Dataset:
        return Dataset(self.tokens[index], self.lengths[index])


def parse_names(lines: list[str], source: str, *, drop_invalid: bool = False) -> NameSet:
    """Clean lines: strip, skip blanks, case fold, and reject (or drop) characters outside a-z."""
    names: list[str] = []
    dropped = 0
    for lineno, raw in enumerate(lines, start=1):
        name = raw.strip().casefold()
        if not name:
            continue
        bad = next((ch for ch in name if ch not in _ALPHABET), None)
        if bad is not None:
            if drop_invalid:
                dropped += 1
                continue
            raise DataError(
                f"{source}:{lineno}: character {bad!r} is outside a-z "
                "(pass drop_invalid / --drop-invalid to skip such lines)"
            )
        names.append(name)
    if not names:
        raise DataError(f"{source}: no names found (the file is empty or every line was dropped)")
    return NameSet(names, source, dropped)


def read_names(path: str | Path, *, drop_invalid: bool = False) -> NameSet:
    """Read and clean a UTF-8 names file, one name per line (size and line length bounded: names_reader)."""
    read = read_name_lines(path)
    names = parse_names(read.lines, str(path), drop_invalid=drop_invalid)
    names.sha256 = read.sha256
    return names


def encode(names: list[str]) -> tuple[Dataset, int]:
    """[BOUNDARY] + chars + [BOUNDARY], truncated to MAX_SEQ tokens; padding positions hold PAD.

    Returns the dataset and how many names were truncated.
    """
    tokens = np.full((len(names), MAX_SEQ), PAD, dtype=np.uint8)
    lengths = np.empty(len(names), dtype=np.uint8)
    truncated = 0
    for i, name in enumerate(names):
        seq = [BOUNDARY, *(ord(ch) - ord("a") for ch in name), BOUNDARY]
        if len(seq) > MAX_SEQ:
            truncated += 1
            seq = seq[:MAX_SEQ]
        tokens[i, : len(seq)] = seq
        lengths[i] = len(seq)
    return Dataset(tokens, lengths), truncated


def split(data: Dataset, val_fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded shuffle, then the first ceil(val_fraction * N) names are validation."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    n = len(data)
    n_val = int(np.ceil(val_fraction * n))
    if n_val >= n:
        raise DataError(f"{n} names are too few to split off {val_fraction:.0%} for validation")
    order = np.random.default_rng([seed, 1]).permutation(n)  # stream 1: independent of init and batches
    return data.subset(order[n_val:]), data.subset(order[:n_val])


class BatchSampler:
    """Uniform sampling with replacement, as the seed; the generator state makes resumes exact."""

    TRAIN_STREAM = 2  # seed streams: 1 is the split, 2 the training batches, others are free for tools

    def __init__(self, data: Dataset, batch: int, seed: int, stream: int = TRAIN_STREAM) -> None:
        if batch < 1:
            raise DataError(f"batch must be >= 1, got {batch}")
        self.data = data
        self.batch = batch
        self.rng = np.random.default_rng([seed, stream])

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n batches: tokens uint8 [n, B, MAX_SEQ], lengths uint8 [n, B]."""
        index = self.rng.integers(0, len(self.data), size=(n, self.batch))
        return self.data.tokens[index], self.data.lengths[index]

    def get_state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def set_state(self, state: dict[str, Any]) -> None:
        problem = sampler_state_problem(state)
        if problem is None:
            try:
                self.rng.bit_generator.state = state
            except (TypeError, ValueError, KeyError, OverflowError) as e:
                problem = str(e)
        if problem is not None:
            raise DataError(f"invalid sampler state: {problem}")


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
