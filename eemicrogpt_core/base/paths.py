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
