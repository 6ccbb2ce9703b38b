"""User-given paths: `~` and `~user` expanded, and a `~user` that names no user refused instead of becoming a
directory literally called `~user` in the working directory."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def user_path(value: str | Path, what: str) -> Path:
    """value with ~ expanded; `what` names the flag or key in the error (e.g. "--out")."""
    path = Path(os.path.expanduser(value))  # Path.expanduser raises RuntimeError for an unknown user
    if str(path).startswith("~"):
        user = str(path).split("/", 1)[0]
        raise ConfigError(f"{what} {value}: cannot expand {user} (no such user); write the full path")
    return path


def resolved_dir(path: Path) -> Path:
    """Where a directory path really leads, for deciding who owns it: `a/sub/..` is `a` whether or not `sub`
    exists (the kernel would create `sub` on the way and then land in `a`). Paths without `..` are kept as
    given (their symlinks resolve the same either way, and the user sees the path they typed)."""
    return path.resolve() if ".." in path.parts else path
