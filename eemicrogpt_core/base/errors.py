"""User-facing errors: the CLI prints these as one line (no traceback) and exits non-zero."""

from __future__ import annotations

import errno


class EemicrogptError(Exception):
    """Base of every error caused by the user's input or environment rather than a bug."""


class ConfigError(EemicrogptError):
    """A config file or flag is malformed, unknown or impossible."""


class DataError(EemicrogptError):
    """The names file is missing, unreadable or malformed."""


class CheckpointError(EemicrogptError):
    """A run directory or checkpoint cannot be read or does not match."""


class BackendSelectionError(EemicrogptError):
    """The requested backend is unknown, unavailable here, or cannot run this configuration."""


class BatchError(EemicrogptError, ValueError):
    """Arrays handed to a backend have the wrong dtype, shape or values."""


class NonFiniteError(EemicrogptError, FloatingPointError):
    """A backend computed a non-finite loss, gradient or parameter (native status EMG_ERR_NONFINITE, or
    numpy_ref's floating-point check): the trainer treats it as divergence."""


class BackendOutputError(EemicrogptError):
    """A backend session returned something malformed (wrong type, dtype, shape, count or step)."""


class OutOfMemoryError(EemicrogptError, MemoryError):
    """The machine could not hold what was asked for (still a MemoryError to code that catches those)."""


class StorageError(EemicrogptError):
    """The operating system refused a read or write (permissions, read-only or full disk, a missing folder)."""


_ADVICE = {
    errno.ENOSPC: "free some disk space",
    errno.EDQUOT: "free some disk space (quota exceeded)",
    errno.EROFS: "the file system is read-only; choose a writable location",
    errno.EACCES: "you lack permission; choose a writable location or fix the permissions",
    errno.EPERM: "you lack permission; choose a writable location or fix the permissions",
    errno.ENOTDIR: "a parent of this path is a file, not a directory; choose another path",
    errno.ENOENT: "a parent folder is missing; create it or choose another path",
    errno.EISDIR: "it is a directory; give a file path",
    errno.ELOOP: "it is a symbolic link, which eemicrogpt does not write through; remove the link",
    errno.EEXIST: "it already exists and eemicrogpt never replaces a file it did not create; choose a new path",
}


def describe_os_error(e: OSError, doing: str) -> str:
    """One sentence for the user: what failed, on which path, why, and what to do."""
    where = f" {e.filename}" if e.filename else ""
    reason = e.strerror or str(e)
    advice = _ADVICE.get(e.errno or 0)
    return f"{doing}{where}: {reason}" + (f"; {advice}" if advice else "")
