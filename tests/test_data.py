"""Names parsing, encoding at a context, the seeded split and the seeded batch sampler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eemicrogpt_core.base.errors import DataError
from eemicrogpt_core.data.names import PAD, BatchSampler, encode, fixed_batches, parse_names, read_names, split
from eemicrogpt_core.model.shape import DEFAULT_CONTEXT
from eemicrogpt_core.model.vocab import Vocabulary

NAMES = Vocabulary.names()  # a..z = 0..25, boundary 26
B = NAMES.boundary


def test_parse_skips_blanks_strips_and_keeps_case() -> None:
    names = parse_names(["Emma", "", "  olivia \r", "\t", "ZOE"], "x.txt")
    assert names.names == ["Emma", "olivia", "ZOE"]
    assert names.n_dropped == 0


def test_lowercase_folds_case() -> None:
    assert parse_names(["Emma", "ZOE", "Élodie"], "x.txt", lowercase=True).names == ["emma", "zoe", "élodie"]


def test_no_printable_character_is_refused() -> None:
    """Spaces, punctuation, digits, accents and symbols are all symbols now."""
    lines = ["new york", "st. louis", "jean-luc", "farfetch'd", "porygon2", "josé", "nidoran♀", "straße"]
    assert parse_names(lines, "x.txt").names == lines


@pytest.mark.parametrize("control", ["\x00", "\x07", "\t", "\x1b", "\x7f", "\x85", "\r"])
def test_control_character_inside_a_name_names_file_line_and_code_point(control: str) -> None:
    with pytest.raises(DataError, match=rf"x\.txt:3: control character U\+{ord(control):04X}\b"):
        parse_names(["anna", "", f"b{control}b"], "x.txt")


def test_control_character_line_number_counts_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ctl.txt"
    path.write_bytes("\ufeffanna\r\n\r\nbob\r\nzo\x00e\r\n".encode())
    with pytest.raises(DataError, match=r"ctl\.txt:4: control character U\+0000"):
        read_names(path)


def test_drop_invalid_counts_dropped_lines() -> None:
    names = parse_names(["anna", "jo\x00jo", "émile", "b\x07b", "bob"], "x.txt", drop_invalid=True)
    assert names.names == ["anna", "émile", "bob"]
    assert names.n_dropped == 2


def test_a_fixed_vocabulary_refuses_other_characters_by_line() -> None:
    with pytest.raises(DataError, match=r"x\.txt:2: character 'ë' \(ë\) is not in the checkpoint's vocabulary"):
        parse_names(["anna", "zoë"], "x.txt", vocab=NAMES)
    with pytest.raises(DataError, match=r"x\.txt:1: character ' ' \(U\+0020\) is not in the checkpoint's"):
        parse_names(["mary ann"], "x.txt", vocab=NAMES)
    kept = parse_names(["anna", "zoë", "Bob", "eve"], "x.txt", vocab=NAMES, drop_invalid=True)
    assert kept.names == ["anna", "eve"] and kept.n_dropped == 2


def test_lines_split_on_newline_only(tmp_path: Path) -> None:
    """U+2028 (line separator) inside a name is one of its characters, not a line break."""
    path = tmp_path / "sep.txt"
    path.write_text("ann\u2028marie\nbob\n", encoding="utf-8")
    names = read_names(path).names
    assert names == ["ann\u2028marie", "bob"]
    assert "\u2028" in Vocabulary.from_names(names).symbols


def test_nfc_makes_decomposed_and_composed_accents_equal(tmp_path: Path) -> None:
    path = tmp_path / "nfc.txt"
    path.write_text("jose\u0301\njos\u00e9\n", encoding="utf-8")
    names = read_names(path).names
    assert names == ["jos\u00e9", "jos\u00e9"]
    assert Vocabulary.from_names(names).symbols == ("j", "o", "s", "\u00e9")  # no U+0301 of its own


def test_lowercase_output_is_nfc_too() -> None:
    """Some capitals with a combining mark have no composed form, but their lowercase does: T + U+0308
    lowercases to t + U+0308, which NFC composes to U+1E97. The same text must give the same symbols."""
    folded = parse_names(["T\u0308", "J\u030c"], "x.txt", lowercase=True).names
    assert folded == ["\u1e97", "\u01f0"] == parse_names(["\u1e97", "\u01f0"], "x.txt").names


def test_sharp_s_is_kept_with_and_without_lowercase() -> None:
    assert parse_names(["straße"], "x.txt").names == ["straße"]
    assert parse_names(["Straße", "STRASSE"], "x.txt", lowercase=True).names == ["straße", "strasse"]


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    with pytest.raises(DataError, match="no names found"):
        read_names(path)


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="names file not found"):
        read_names(tmp_path / "nope.txt")
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"anna\nb\xe9a\n")
    with pytest.raises(DataError, match=r"latin1\.txt:2: not valid UTF-8"):
        read_names(path)


def test_byte_order_mark_and_crlf_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "windows.txt"
    path.write_bytes("\ufeffEmma\r\nNoah\r\n".encode())
    assert read_names(path).names == ["Emma", "Noah"]


def test_real_names_file(names_file: Path) -> None:
    names = read_names(names_file)
    assert len(names.names) == 32033
    vocab = Vocabulary.from_names(names.names)
    assert vocab == NAMES and vocab.size == 27 and vocab.boundary == 26
    data, truncated = encode(names.names, vocab, DEFAULT_CONTEXT)
    assert len(data) == 32033 and data.tokens.shape == (32033, DEFAULT_CONTEXT + 1)
    # The file's longest names have 15 letters: at context 16 every name keeps its end token.
    longest = [i for i, n in enumerate(names.names) if len(n) == 15]
    assert longest and truncated == 0
    assert np.all(data.tokens[longest, 16] == B) and np.all(data.lengths[longest] == 17)
    assert np.all(data.tokens[:, 0] == B)
    _, truncated_at_15 = encode(names.names, vocab, 15)
    assert truncated_at_15 == len(longest)  # the old 16-token rows lost exactly these end tokens


def test_encode_boundaries_padding_and_truncation() -> None:
    data, truncated = encode(["ab", "z" * 15, "q" * 16, "y" * 20], NAMES, 16)
    assert truncated == 2  # the 16- and 20-letter names
    assert data.tokens.dtype == np.uint8 and data.lengths.dtype == np.uint16
    assert data.tokens.shape == (4, 17)
    assert list(data.tokens[0, :4]) == [B, 0, 1, B]
    assert np.all(data.tokens[0, 4:] == PAD)
    assert list(data.lengths) == [4, 17, 17, 17]
    assert data.tokens[1, 16] == B and np.all(data.tokens[1, 1:16] == 25)  # 15 letters keep their end token
    assert np.all(data.tokens[2, 1:] == ord("q") - ord("a"))  # 16 letters: all predicted, no end token
    assert data.tokens[3, 0] == B and np.all(data.tokens[3, 1:] == ord("y") - ord("a"))


@pytest.mark.parametrize("context", [1, 3, 64])
def test_encode_at_other_contexts(context: int) -> None:
    vocab = Vocabulary.from_names(["é-a ♀", "b"])
    data, truncated = encode(["é-a ♀", "b", "", "a" * 70], vocab, context)
    assert data.tokens.shape == (4, context + 1)
    assert int(data.lengths.max()) <= context + 1 and int(data.lengths.min()) >= 2
    # a name keeps its end token when it has fewer letters than the context
    assert truncated == sum(len(n) >= context for n in ["é-a ♀", "b", "", "a" * 70])
    want = [vocab.boundary, *vocab.encode("é-a ♀"), vocab.boundary][: context + 1]
    assert list(data.tokens[0, : len(want)]) == want and data.lengths[0] == len(want)
    assert list(data.tokens[2, :2]) == [vocab.boundary] * 2 and data.lengths[2] == 2


def _dataset(n: int = 100):
    return encode([chr(ord("a") + i % 26) * (1 + i % 10) for i in range(n)], NAMES, DEFAULT_CONTEXT)[0]


def test_split_is_seeded_disjoint_and_sized() -> None:
    data = _dataset(100)
    parts = split(data, 0.1, seed=7)
    again = split(data, 0.1, seed=7)
    other = split(data, 0.1, seed=8)
    assert parts.validation is not None and again.validation is not None and parts.note == ""
    assert (len(parts.train), len(parts.validation)) == (90, 10)
    assert np.array_equal(parts.train.tokens, again.train.tokens)
    assert np.array_equal(parts.validation.tokens, again.validation.tokens)
    assert not np.array_equal(parts.train.tokens, other.train.tokens)
    rows = {bytes(r) for r in parts.train.tokens} | {bytes(r) for r in parts.validation.tokens}
    assert rows == {bytes(r) for r in data.tokens}


@pytest.mark.parametrize("fraction", [1.0, -0.1, float("nan")])
def test_split_rejects_impossible_fractions(fraction: float) -> None:
    with pytest.raises(DataError, match="val_fraction"):
        split(_dataset(10), fraction, seed=0)


def test_val_fraction_zero_means_no_validation() -> None:
    data = _dataset(10)
    parts = split(data, 0.0, seed=0)
    assert parts.validation is None and parts.train is data
    assert "no validation" in parts.note and "\n" not in parts.note


def test_one_name_validates_on_the_training_name() -> None:
    data = _dataset(1)
    parts = split(data, 0.1, seed=0)
    assert parts.validation is not None and np.array_equal(parts.validation.tokens, data.tokens)
    assert np.array_equal(parts.train.tokens, data.tokens)
    assert parts.note.startswith("1 name is too few") and "training names" in parts.note


def test_two_names_validate_on_the_training_names() -> None:
    data = _dataset(2)
    parts = split(data, 0.1, seed=0)
    assert len(parts.train) == 2 and parts.note.startswith("2 names are too few")


def test_sampler_shapes_and_determinism() -> None:
    data = _dataset(50)
    tokens, lengths = BatchSampler(data, 16, seed=3).sample(5)
    assert tokens.shape == (5, 16, DEFAULT_CONTEXT + 1) and tokens.dtype == np.uint8
    assert lengths.shape == (5, 16) and lengths.dtype == np.uint16
    tokens2, lengths2 = BatchSampler(data, 16, seed=3).sample(5)
    assert np.array_equal(tokens, tokens2) and np.array_equal(lengths, lengths2)
    tokens3, _ = BatchSampler(data, 16, seed=4).sample(5)
    assert not np.array_equal(tokens, tokens3)


def test_sampler_sequence_does_not_depend_on_chunking() -> None:
    data = _dataset(50)
    whole = BatchSampler(data, 4, seed=1).sample(8)[0]
    sampler = BatchSampler(data, 4, seed=1)
    parts = np.concatenate([sampler.sample(3)[0], sampler.sample(1)[0], sampler.sample(4)[0]])
    assert np.array_equal(whole, parts)


def test_sampler_state_round_trip() -> None:
    data = _dataset(50)
    a = BatchSampler(data, 4, seed=1)
    a.sample(3)
    state = a.get_state()
    expected = a.sample(2)[0]
    b = BatchSampler(data, 4, seed=99)
    b.set_state(state)
    assert np.array_equal(b.sample(2)[0], expected)
    with pytest.raises(DataError, match="invalid sampler state"):
        b.set_state({"bit_generator": "nonsense"})


def test_sampler_rejects_batch_zero() -> None:
    with pytest.raises(DataError, match="batch must be >= 1"):
        BatchSampler(_dataset(5), 0, seed=0)


def test_fixed_batches_whole_batches_and_tiny_sets() -> None:
    data = _dataset(50)
    batches = fixed_batches(data, 16, max_batches=10)
    assert [t.shape[0] for t, _ in batches] == [16, 16, 16]
    assert len(fixed_batches(data, 16, max_batches=2)) == 2
    tiny = fixed_batches(_dataset(5), 16, max_batches=10)
    assert len(tiny) == 1 and tiny[0][0].shape == (5, DEFAULT_CONTEXT + 1)
