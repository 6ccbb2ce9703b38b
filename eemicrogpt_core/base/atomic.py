"""Atomic file writes: a temporary file in the same directory, fsynced, then renamed over the target (a file
of ours) or linked to a new name (a file that must not replace anything); appends that never follow a link."""

from __future__ import annotations

import contextlib
import errno
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


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[tuple[BinaryIO, str]]:
    """A new temporary file beside path (named as remove_stale_temporaries expects), with the mode an ordinary
    create would give (0666 less the umask), not mkstemp's private 0600; fsynced when the block ends, removed
    if it fails. OS errors name path, the file the user knows, not the temporary one."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write() names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of either (os.replace is atomic on POSIX). A link
    at path is replaced itself, never written through. Missing parent folders are made (a run directory's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _temporary_beside(path) as (f, tmp):
        f.write(data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def atomic_create_bytes(path: Path, data: bytes) -> None:
    """A new file holding data, whole or not at all; see created_file."""
    with created_file(path) as f:
        f.write(data)


def append_text(path: Path, text: str) -> None:
    """Append to a log of ours (created if missing); a link at path is refused (ELOOP), never written through."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    try:
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        if e.filename is None:  # a failed write() names no file: name the one the user knows
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


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


def _create_exclusive(path: Path, data: bytes) -> None:
    """O_EXCL creation (never replaces, never follows a link); a failed write removes the partial file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def created_file(path: Path) -> Iterator[BinaryIO]:
    """Write a new file that appears whole or not at all (a full disk leaves nothing behind to block a re-run)
    and never replaces or follows anything: the bytes go to a temporary file in the same directory (which must
    exist: a user's new file gets no folders made for it), then hard-linked to path. os.link gives both: it
    fails on an existing name, a dangling symlink included, where a rename would replace it, and the name
    appears only once the data is on disk. FileExistsError if path exists; on any failure the temporary file
    is removed and path is left as it was."""
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    with _temporary_beside(path) as (f, tmp):
        yield f
    try:
        os.link(tmp, path)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(e.errno, e.strerror, str(path)) from e  # name path, not the temporary file
        _create_exclusive(path, Path(tmp).read_bytes())  # a file system without hard links (FAT, some FUSE)
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_directory(path.parent)
