"""Bounded reads of files that must be regular files: a device, FIFO or socket is refused before a byte is
read (opened with O_NONBLOCK, so a FIFO with no writer cannot block the open), and the size bound counts the
bytes actually read, not st_size (which a device, /proc file or growing file does not report truthfully)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import EemicrogptError, StorageError, describe_os_error

CHUNK_BYTES = 1 << 20


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, from its st_mode (for a one-line refusal)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: Path, what: str, error: type[EemicrogptError] = StorageError) -> int:
    """A read-only descriptor of `path`, refused with error(...) unless it is a regular file (a symlink to one
    is fine). FileNotFoundError passes through for the caller to word."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise error(describe_os_error(e, f"cannot read {what}")) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: the {what} is {file_kind(mode)}; give the path of a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular_bytes(path: str | Path, what: str, max_bytes: int,
                       error: type[EemicrogptError] = StorageError) -> bytes:
    """The whole of a regular file of at most max_bytes, counted as read: error(...) names the file and the
    bound when it holds more (nothing past max_bytes + 1 is read)."""
    path = Path(path)
    fd = open_regular(path, what, error)
    try:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, min(CHUNK_BYTES, max_bytes + 1 - total))
            except OSError as e:
                raise error(describe_os_error(OSError(e.errno, e.strerror, str(path)), f"cannot read {what}")) from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise error(f"{path}: the {what} holds more than {max_bytes:,} bytes, far more than eemicrogpt "
                            "writes or reads there")
    finally:
        os.close(fd)
