"""Reading a names file with bounds: its size and each line's length are checked on the bytes, as they stream
in and before anything is decoded, so a 200 MB one-line file (or one that grows while it is read) is refused
after reading at most a bound's worth, in constant memory beyond the lines kept. Only a regular file is read:
`/dev/zero`, a FIFO or a directory is refused before a byte is read (a FIFO without a writer does not block).

Lines end at "\\n" only (a trailing "\\r" is the caller's to strip): U+2028 and the other characters that
str.splitlines treats as breaks stay inside their line, so line numbers in errors are the editor's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import DataError
from ..base.reading import open_regular

# makemore's names.txt is 228 KB of 32,033 names: 32 MiB is 140 times that, and its lines as str objects
# stay under a few GB even when every name is one letter.
MAX_FILE_BYTES = 32 << 20
# A name is at most a few dozen characters (it is cut to the model's context); 1 KiB leaves room for
# surrounding spaces and multi-byte characters while stopping a file that is one enormous line.
MAX_LINE_BYTES = 1024
CHUNK_BYTES = 1 << 16
BOM = b"\xef\xbb\xbf"  # a leading byte-order mark (Windows editors) is not part of a name


@dataclass
class NameLines:
    lines: list[str]  # decoded, in file order, without their "\n"
    sha256: str  # of the file's bytes, BOM included: the fingerprint checkpoints keep


def open_bounded(path: Path, what: str, max_bytes: int, too_big: Callable[[str], DataError]) -> int:
    """A descriptor of the file `what` ("names file", "text file") at path, refused when it is missing, not a
    regular file (a FIFO, which would block until a writer came, a device, a directory), or a regular file of
    more than max_bytes (too_big(size) says so), before a byte is read."""
    try:
        fd = open_regular(path, what, DataError)
    except FileNotFoundError:
        raise DataError(f"{what} not found: {path}") from None
    try:
        info = os.fstat(fd)
        if info.st_size > max_bytes:
            raise too_big(f"{info.st_size:,} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _too_big(path: Path, size: str, max_bytes: int) -> DataError:
    return DataError(f"{path}: {size}, more than a names file may hold ({max_bytes:,} bytes); pass a file of "
                     "one name per line")


def _decode(path: Path, raw: bytes, lineno: int, first: bool) -> str:
    if first and raw.startswith(BOM):
        raw = raw[len(BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {raw[e.start]:#04x})") from None


def read_name_lines(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES,
                    max_line_bytes: int = MAX_LINE_BYTES) -> NameLines:
    """The file's lines, decoded from UTF-8, with the sha256 of its bytes; DataError when it is missing,
    unreadable, larger than max_bytes, has a line longer than max_line_bytes (its "\\n" not counted) or is not
    UTF-8 (each naming the file and, where it applies, the line)."""
    path = Path(path)
    fd = open_bounded(path, "names file", max_bytes, lambda size: _too_big(path, size, max_bytes))
    try:
        digest = hashlib.sha256()
        lines: list[str] = []
        pending = b""  # the line being read: at most max_line_bytes + one chunk
        total = 0
        while True:
            try:
                chunk = os.read(fd, CHUNK_BYTES)
            except OSError as e:
                raise DataError(f"cannot read names file {path}: {e.strerror or e}") from None
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # a file that grew while it was read
                raise _too_big(path, f"more than {max_bytes:,} bytes", max_bytes)
            digest.update(chunk)
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            for raw in parts:
                lines.append(_checked_line(path, raw, len(lines) + 1, max_line_bytes))
            if len(pending) > max_line_bytes:
                raise _long_line(path, len(lines) + 1, max_line_bytes)
        if pending:
            lines.append(_checked_line(path, pending, len(lines) + 1, max_line_bytes))
        return NameLines(lines, digest.hexdigest())
    finally:
        os.close(fd)


def _long_line(path: Path, lineno: int, max_line_bytes: int) -> DataError:
    return DataError(f"{path}:{lineno}: line longer than {max_line_bytes:,} bytes; a names file holds one short "
                     "name per line")


def _checked_line(path: Path, raw: bytes, lineno: int, max_line_bytes: int) -> str:
    if len(raw) > max_line_bytes:
        raise _long_line(path, lineno, max_line_bytes)
    return _decode(path, raw, lineno, first=lineno == 1)
