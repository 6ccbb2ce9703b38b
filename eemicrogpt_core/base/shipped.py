"""The configs and sweep specs that ship inside the package (eemicrogpt_core/configs/ and its sweeps/), found
by name: `--config d16` and `eemicrogpt sweep time_to_2` work after `pip install`, outside any checkout.

A file that exists always wins over a shipped name, so a path keeps working; a value that is neither is
refused in one line naming the shipped ones.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import ConfigError
from .paths import user_path

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs"
KINDS = {"config": SHIPPED_DIR, "sweep": SHIPPED_DIR / "sweeps"}
SUFFIX = ".yaml"


def _natural(path: Path) -> list[str | int]:
    """d16 before d128: numbers in a name compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def shipped(kind: str) -> dict[str, Path]:
    """The shipped files of a kind ("config" or "sweep") by name (the file name without .yaml), d16 before d128."""
    return {p.name.removesuffix(SUFFIX): p for p in sorted(KINDS[kind].glob(f"*{SUFFIX}"), key=_natural)}


def description(path: Path) -> str:
    """A file's first comment line, which each shipped file writes as its one-line summary."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def find(value: str | Path, kind: str, what: str) -> Path:
    """The file `value` names: an existing path as given, else the shipped file of that name (`d16`,
    `d16.yaml`); `what` names the flag or argument in the error."""
    path = user_path(value, what)
    if path.exists():
        return path
    name = str(value).removesuffix(SUFFIX)
    found = shipped(kind).get(name)
    if found is not None and "/" not in name and "\\" not in name:
        return found
    names = ", ".join(shipped(kind)) or "none"
    raise ConfigError(f"{what} {value}: no such file, and not a shipped {kind} (shipped: {names}; `eemicrogpt "
                      "configs` describes them)")
