"""The vocabulary a names file defines: its sorted distinct characters plus the boundary token."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from eemicrogpt_core.base.abi import MAX_VOCAB
from eemicrogpt_core.base.errors import DataError
from eemicrogpt_core.data.names import read_names
from eemicrogpt_core.model.vocab import MAX_SYMBOLS, Vocabulary


def _vocab_of(tmp_path: Path, text: str, *, lowercase: bool = False) -> Vocabulary:
    path = tmp_path / "names.txt"
    path.write_text(text, encoding="utf-8")
    return Vocabulary.from_names(read_names(path, lowercase=lowercase).names)


def test_names_file_gives_a_to_z_then_the_boundary(names_file: Path) -> None:
    vocab = Vocabulary.from_names(read_names(names_file).names)
    assert vocab.symbols == tuple(string.ascii_lowercase)
    assert vocab.size == 27 and vocab.boundary == 26
    assert vocab.encode("az") == [0, 25]
    assert vocab.describe() == "27 tokens: a-z and the boundary"


def test_every_kind_of_character_is_kept_in_code_point_order(tmp_path: Path) -> None:
    vocab = _vocab_of(tmp_path, "New York\nst. louis\nJean-Luc\nJosé\nporygon2\nNidoran♀\n")
    for ch in " .-2NYJLé♀":
        assert ch in vocab.symbols, ch
    assert list(vocab.symbols) == sorted(vocab.symbols, key=ord)
    assert vocab.symbols[0] == " " and vocab.symbols[-1] == "♀"
    assert vocab.boundary == len(vocab.symbols) == vocab.size - 1


def test_case_is_kept_unless_lowercase(tmp_path: Path) -> None:
    assert _vocab_of(tmp_path, "Ab\naB\n").symbols == ("A", "B", "a", "b")
    assert _vocab_of(tmp_path, "Ab\naB\n", lowercase=True).symbols == ("a", "b")


def test_describe_shows_invisible_symbols(tmp_path: Path) -> None:
    text = _vocab_of(tmp_path, "a b\nc\u2028d\n").describe()
    assert text.startswith("7 tokens: ") and "U+2028" in text and "␠" in text and text.endswith("and the boundary")


def test_encode_decode_round_trip_and_decode_stops_at_the_boundary() -> None:
    vocab = Vocabulary.from_names(["straße", "zoë ♀"])
    for text in ("straße", "zoë ♀", "ß ", ""):
        assert vocab.decode(vocab.encode(text)) == text
    tokens = [*vocab.encode("zoë"), vocab.boundary, *vocab.encode("ras")]
    assert vocab.decode(tokens) == "zoë"
    assert vocab.unknown("straße") is None and vocab.unknown("strasse!") == "!"


def test_the_largest_vocabulary_fits_256_tokens() -> None:
    symbols = [chr(0x100 + i) for i in range(MAX_SYMBOLS)]
    vocab = Vocabulary.from_names(["".join(symbols)])
    assert MAX_SYMBOLS == 255 and vocab.size == 256 and vocab.boundary == 255


def test_too_many_characters_is_one_error_naming_the_count_and_the_rarest(tmp_path: Path) -> None:
    common = [chr(0x100 + i) for i in range(MAX_SYMBOLS)]
    rare = "\u4e00"  # once in the file; every other character at least twice
    lines = ["".join(common), "".join(common), f"x{rare}"]
    path = tmp_path / "many.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        Vocabulary.from_names(read_names(path).names)
    message = str(caught.value)
    assert "\n" not in message
    assert "257 distinct characters" in message and "at most 255" in message
    # 257 distinct, 2 too many: the two seen once are named (x and the rare one), no common one
    assert rare in message and "The 2 rarest" in message
    assert not any(ch in message for ch in common)


@pytest.mark.parametrize("symbols", [(), ("b", "a"), ("a", "a"), ("ab",)])
def test_a_malformed_symbol_table_is_refused(symbols: tuple[str, ...]) -> None:
    with pytest.raises(DataError):
        Vocabulary(symbols)


def test_a_text_vocabulary_has_no_boundary_token() -> None:
    vocab = Vocabulary(("\n", " ", "a", "b"), with_boundary=False)
    assert vocab.size == 4
    assert vocab.decode([2, 3, 0, 1, 2]) == "ab\n a"  # no token ends the text
    assert "boundary" not in vocab.describe()
    with pytest.raises(ValueError, match="no boundary"):
        _ = vocab.boundary
    lists = Vocabulary(("a", "b"))
    assert lists.size == 3 and lists.boundary == 2 and lists.decode([0, 2, 1]) == "a"


def test_a_text_vocabulary_may_use_every_token() -> None:
    every = tuple(chr(0x100 + i) for i in range(MAX_VOCAB))
    assert Vocabulary(every, with_boundary=False).size == MAX_VOCAB
    with pytest.raises(DataError, match=f"at most {MAX_VOCAB - 1}"):
        Vocabulary(every)
