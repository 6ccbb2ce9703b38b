"""Names parsing, encoding, the seeded split and the seeded batch sampler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eemicrogpt_core.data import PAD, BatchSampler, encode, fixed_batches, parse_names, read_names, split
from eemicrogpt_core.errors import DataError
from eemicrogpt_core.model import BOUNDARY, MAX_SEQ


def test_parse_skips_blanks_strips_and_case_folds() -> None:
    names = parse_names(["Emma", "", "  olivia \r", "\t", "ZOE"], "x.txt")
    assert names.names == ["emma", "olivia", "zoe"]
    assert names.n_dropped == 0


def test_invalid_character_names_file_line_and_character() -> None:
    with pytest.raises(DataError, match=r"x\.txt:3: character '7' is outside a-z"):
        parse_names(["anna", "", "b7b"], "x.txt")
    with pytest.raises(DataError, match=r"x\.txt:1: character ' '"):
        parse_names(["mary ann"], "x.txt")


def test_drop_invalid_counts_dropped_lines() -> None:
    names = parse_names(["anna", "jo-jo", "émile", "bob"], "x.txt", drop_invalid=True)
    assert names.names == ["anna", "bob"]
    assert names.n_dropped == 2


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
    assert read_names(path).names == ["emma", "noah"]


def test_real_names_file(names_file: Path) -> None:
    names = read_names(names_file)
    assert len(names.names) == 32033
    data, truncated = encode(names.names)
    assert len(data) == 32033
    longest = max(len(n) for n in names.names)
    assert truncated == sum(len(n) > MAX_SEQ - 2 for n in names.names)
    assert longest > MAX_SEQ - 2 and truncated > 0  # the file has names longer than 14 characters


def test_encode_boundaries_padding_and_truncation() -> None:
    data, truncated = encode(["ab", "z" * 14, "y" * 20])
    assert truncated == 1
    assert data.tokens.dtype == np.uint8 and data.lengths.dtype == np.uint8
    assert data.tokens.shape == (3, MAX_SEQ)
    assert list(data.tokens[0, :4]) == [BOUNDARY, 0, 1, BOUNDARY]
    assert np.all(data.tokens[0, 4:] == PAD)
    assert list(data.lengths) == [4, 16, 16]
    assert data.tokens[1, 15] == BOUNDARY  # 14 characters still fit with both boundaries
    assert data.tokens[2, 0] == BOUNDARY and np.all(data.tokens[2, 1:] == ord("y") - ord("a"))


def _dataset(n: int = 100):
    return encode([chr(ord("a") + i % 26) * (1 + i % 10) for i in range(n)])[0]


def test_split_is_seeded_disjoint_and_sized() -> None:
    data = _dataset(100)
    train, val = split(data, 0.1, seed=7)
    again_train, again_val = split(data, 0.1, seed=7)
    other_train, _ = split(data, 0.1, seed=8)
    assert (len(train), len(val)) == (90, 10)
    assert np.array_equal(train.tokens, again_train.tokens) and np.array_equal(val.tokens, again_val.tokens)
    assert not np.array_equal(train.tokens, other_train.tokens)
    rows = {bytes(r) for r in train.tokens} | {bytes(r) for r in val.tokens}
    assert rows == {bytes(r) for r in data.tokens}


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_split_rejects_impossible_fractions(fraction: float) -> None:
    with pytest.raises(DataError, match="val_fraction"):
        split(_dataset(10), fraction, seed=0)


def test_split_rejects_too_few_names() -> None:
    with pytest.raises(DataError, match="too few"):
        split(_dataset(1), 0.5, seed=0)


def test_sampler_shapes_and_determinism() -> None:
    data = _dataset(50)
    tokens, lengths = BatchSampler(data, 16, seed=3).sample(5)
    assert tokens.shape == (5, 16, MAX_SEQ) and tokens.dtype == np.uint8
    assert lengths.shape == (5, 16) and lengths.dtype == np.uint8
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
    assert len(tiny) == 1 and tiny[0][0].shape == (5, MAX_SEQ)
