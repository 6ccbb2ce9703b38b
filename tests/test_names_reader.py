"""The names file is read as a bounded stream: size and line length checked on the bytes before decoding, lines
split on "\\n" only. The size cases use small bounds (or a device that never ends), never the memory a real
oversized file would take."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eemicrogpt_core.base.errors import DataError
from eemicrogpt_core.data import names_reader
from eemicrogpt_core.data.names import read_names
from eemicrogpt_core.data.names_reader import read_name_lines
from eemicrogpt_core.interface import cli


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_lines_decoded_with_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbfemma\r\nolivia\n\nava"
    read = read_name_lines(write(tmp_path / "n.txt", data))
    assert read.lines == ["emma\r", "olivia", "", "ava"]  # BOM dropped; "\r" stripped later with the spaces
    assert read.sha256 == hashlib.sha256(data).hexdigest()
    assert read_names(tmp_path / "n.txt").names == ["emma", "olivia", "ava"]


def test_lines_end_at_newline_only(tmp_path: Path) -> None:
    """U+2028 (and U+0085, form feed...) are no line break: the line numbers in errors are the editor's."""
    path = write(tmp_path / "n.txt", "anna\nbo\u2028b\nx\x01\n".encode())
    assert read_name_lines(path).lines == ["anna", "bo\u2028b", "x\x01"]
    with pytest.raises(DataError, match=r"n\.txt:3: control character"):
        read_names(path)
    write(path, "an\u2029na\nbo\x85b\nx\n".encode())
    with pytest.raises(DataError, match=r"n\.txt:2: control character"):
        read_names(path)


def test_invalid_utf8_names_its_line_before_any_decoding_of_later_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "n.txt", b"anna\nbob\n\xffcd\n" + b"e\n" * 10)
    with pytest.raises(DataError, match=r"n\.txt:3: not valid UTF-8 \(byte 0xff\)"):
        read_name_lines(path)


def test_a_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.txt"
    with path.open("wb") as f:  # sparse: 64 GiB declared, nothing allocated on disk or in memory
        f.truncate(64 << 30)
    reads = []
    monkeypatch.setattr(names_reader.os, "read", lambda fd, n: reads.append(n) or b"")
    with pytest.raises(DataError, match=r"big\.txt: 68,719,476,736 bytes, more than a names file may hold"):
        read_name_lines(path)
    assert reads == []


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes; the reader opens without blocking and refuses
    anything that is not a regular file (run in a thread so a regression fails instead of hanging)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    errors: list[BaseException] = []
    reader = threading.Thread(target=lambda: _capture(errors, fifo), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the read of a FIFO blocked"
    assert len(errors) == 1 and isinstance(errors[0], DataError), errors
    assert "is a FIFO (named pipe); give the path of a regular file" in str(errors[0])


def _capture(errors: list[BaseException], path: Path) -> None:
    try:
        read_name_lines(path)
    except BaseException as e:
        errors.append(e)


def test_dev_zero_is_refused_before_a_byte_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    monkeypatch.setattr(names_reader.os, "read", lambda fd, n: reads.append(n) or b"")
    with pytest.raises(DataError, match=r"/dev/zero: the names file is a device"):
        read_name_lines("/dev/zero")
    assert reads == []


def test_a_long_line_is_refused_where_it_is(tmp_path: Path) -> None:
    path = write(tmp_path / "n.txt", b"anna\nbob\n" + b"x" * 5000 + b"\nend\n")
    with pytest.raises(DataError, match=r"n\.txt:3: line longer than 1,024 bytes"):
        read_name_lines(path)
    with pytest.raises(DataError, match=r"n\.txt:1: line longer than 10 bytes"):
        read_name_lines(write(path, b"abcdefghijkl"), max_line_bytes=10)  # the last line, with no newline
    assert read_name_lines(write(path, b"abcdefghij\n"), max_line_bytes=10).lines == ["abcdefghij"]


def test_missing_unreadable_and_directory_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="names file not found"):
        read_name_lines(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="is a directory"):
        read_name_lines(tmp_path)


def test_the_cli_refuses_dev_zero_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["train", "--backend", "numpy_ref", "--data", "/dev/zero", "--out",
                                          str(tmp_path / "run")], env={"EEMICROGPT_DATA": None})
    assert result.exit_code == 2
    assert result.stderr.strip() == ("eemicrogpt: error: /dev/zero: the names file is a device; give the path of a "
                                     "regular file")
    assert not (tmp_path / "run").exists()
