"""Which directories eemicrogpt made, and so may write among: a marker file holding a fixed line and the
directory's own inode number, written when eemicrogpt creates the directory. A generic name (`.lock`), an
empty or edited marker, or a marker copied from another directory marks nothing, so a user's directory is
never taken for ours by accident. A directory that is moved keeps its inode and stays ours; a copy is not."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .atomic import atomic_write_text
from .errors import EemicrogptError
from .reading import read_regular_bytes

MAX_MARKER_BYTES = 4096


def marker_name(kind: str) -> str:
    """The marker's file name for a kind of directory ("run", "plots")."""
    return f".eemicrogpt-{kind}"


def _marker_text(directory: Path, kind: str) -> str:
    return (f"eemicrogpt {kind} directory: eemicrogpt writes among these files; delete this file to keep it out\n"
            f"inode {os.stat(directory).st_ino}\n")


def mark_directory(directory: Path, kind: str) -> None:
    """Mark a directory eemicrogpt has just created (OSError when it cannot write there)."""
    atomic_write_text(directory / marker_name(kind), _marker_text(directory, kind))


def made_by_eemicrogpt(directory: Path, kind: str) -> bool:
    """The directory holds this kind's marker (a regular file, not a link) naming this very directory."""
    marker = directory / marker_name(kind)
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        text = read_regular_bytes(marker, "directory marker", MAX_MARKER_BYTES).decode("utf-8")
        return text == _marker_text(directory, kind)
    except (OSError, EemicrogptError, UnicodeDecodeError):
        return False
