"""Atomic file writes: a temporary file in the same directory, fsynced, then renamed over the target."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
