"""Atomic file writes: a temporary file in the same directory, fsynced, then renamed over the target (or, for a
file that must not replace anything, linked to a new name)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

_TEMP_MIDDLE = "[a-z0-9_]{8}"  # what tempfile.mkstemp puts between our prefix and suffix


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable: without this a power cut can forget the new name."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # platforms (Windows) or file systems that cannot open a directory: nothing more to do
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory (EINVAL); the rename itself has happened
    finally:
        os.close(fd)


def process_umask() -> int:
    """The umask, read without changing it where the OS allows (os.umask sets it, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of either (os.replace is atomic on POSIX). The file
    gets the mode an ordinary create would (0666 less the umask), not mkstemp's private 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a failed write() names no file: name the one the user knows
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def remove_stale_temporaries(directory: Path, names: Iterable[str]) -> list[Path]:
    """Delete the temporary files that atomic_write_bytes left beside these names when its process was killed
    mid-write (`.checkpoint.npz.k3j_x9a2.tmp`); nothing else matches. Call it only while holding the
    directory's lock: a live writer's temporary file is not stale."""
    pattern = re.compile("|".join(rf"\.{re.escape(name)}\.{_TEMP_MIDDLE}\.tmp" for name in names))
    removed: list[Path] = []
    try:
        candidates = [p for p in Path(directory).iterdir() if pattern.fullmatch(p.name) and p.is_file()]
    except OSError:
        return removed
    for path in candidates:
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass  # left for the next run: it is in the way of nothing
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def created_file(path: Path) -> Iterator[BinaryIO]:
    """Write a new file that appears whole or not at all and never replaces anything: the bytes go to a
    temporary file in the same directory, which is then hard-linked to path (link fails on an existing name,
    a dangling symlink included, where a rename would replace it). FileExistsError if path exists; on any
    failure the temporary file is removed and path is left as it was."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file the user asked for, not the temporary one
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except OSError as e:
        if e.filename is None:  # a failed write() names no file: name the one the user knows
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_directory(path.parent)
