"""The symbol table: the training file's distinct characters, sorted, plus (for lists) the boundary token.

As microgpt builds it (`uchars = sorted(set(''.join(docs)))`, `BOS = len(uchars)`): characters are Unicode
code points after NFC normalisation (data.py normalises), sorted by code point, so the makemore names give
tokens a..z = 0..25 and the boundary 26. A text is one stream with no items to start and end, so its
vocabulary has no boundary token (`with_boundary=False`): its tokens are its characters alone.
"""

from __future__ import annotations

import collections
import string
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from ..base.abi import MAX_VOCAB
from ..base.errors import DataError

MAX_SYMBOLS = MAX_VOCAB - 1  # one token is the boundary
NAMES_SYMBOLS = tuple(string.ascii_lowercase)  # the vocabulary of checkpoints written before symbol tables


def _show(ch: str) -> str:
    """A character as a reader can see it: printable ones as they are, others as U+XXXX."""
    return ch if ch.isprintable() and not ch.isspace() else f"U+{ord(ch):04X}"


@dataclass(frozen=True)
class Vocabulary:
    symbols: tuple[str, ...]  # one character each, sorted by code point, distinct
    with_boundary: bool = True  # lists: a boundary token after the symbols; texts: none

    def __post_init__(self) -> None:
        if not self.symbols:
            raise DataError("the vocabulary is empty: the data has no characters")
        most = MAX_SYMBOLS if self.with_boundary else MAX_VOCAB
        if len(self.symbols) > most:
            raise DataError(f"{len(self.symbols)} distinct characters; at most {most} fit a vocabulary")
        if any(len(ch) != 1 for ch in self.symbols) or list(self.symbols) != sorted(set(self.symbols)):
            raise DataError("a vocabulary's symbols must be distinct single characters in code-point order")
        # A list's items are lines of a names file, whose reader refuses control characters: a table holding one
        # (a newline, a carriage return, an escape) would print names that break lines or drive the terminal.
        control = [ch for ch in self.symbols if unicodedata.category(ch) == "Cc"]
        if self.with_boundary and control:
            raise DataError(f"a list's vocabulary cannot hold control character {_show(control[0])} (items are "
                            "lines of a names file, which has none)")

    @classmethod
    def from_names(cls, names: Iterable[str]) -> Vocabulary:
        """The distinct characters of the names; more than MAX_SYMBOLS is one error naming the rarest."""
        counts = collections.Counter(ch for name in names for ch in name)
        if len(counts) > MAX_SYMBOLS:
            rarest = sorted(counts, key=lambda ch: (counts[ch], ch))[: len(counts) - MAX_SYMBOLS]
            shown = " ".join(_show(ch) for ch in rarest[:10]) + (" ..." if len(rarest) > 10 else "")
            raise DataError(f"the data has {len(counts)} distinct characters; a vocabulary holds at most "
                            f"{MAX_SYMBOLS} (plus the boundary). The {len(rarest)} rarest: {shown}; remove them, "
                            "or fold case with --lowercase")
        return cls(tuple(sorted(counts)))

    @classmethod
    def names(cls) -> Vocabulary:
        return cls(NAMES_SYMBOLS)

    @property
    def size(self) -> int:
        """Tokens, the boundary included where there is one (the model's vocab)."""
        return len(self.symbols) + int(self.with_boundary)

    @property
    def boundary(self) -> int:
        if not self.with_boundary:
            raise ValueError("a text's vocabulary has no boundary token")
        return len(self.symbols)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {ch: i for i, ch in enumerate(self.symbols)}

    def unknown(self, text: str) -> str | None:
        """The first character of text outside this vocabulary, or None."""
        return next((ch for ch in text if ch not in self._index), None)

    def encode(self, text: str) -> list[int]:
        """Tokens of text's characters (no boundaries); every character must be in the vocabulary."""
        index = self._index
        return [index[ch] for ch in text]

    def decode(self, tokens: Iterable[int]) -> str:
        """Characters of tokens up to the first boundary (all of them for a text's vocabulary)."""
        out = []
        for tok in tokens:
            if int(tok) >= len(self.symbols):
                break
            out.append(self.symbols[int(tok)])
        return "".join(out)

    def describe(self) -> str:
        """e.g. '27 tokens: a-z and the boundary' or the symbols written out."""
        shown = "".join(_show(ch) if ch != " " else "␠" for ch in self.symbols)
        if self.symbols == NAMES_SYMBOLS:
            shown = "a-z"
        return f"{self.size} tokens: {shown}" + (" and the boundary" if self.with_boundary else "")
