"""Plugin calls that hung, remembered across commands: a hung probe or hook then costs its deadline once a day,
not on every command.

Only installed distributions are remembered, by distribution, version and what was called, so an upgrade,
a longer deadline than the one it missed ($EEMICROGPT_PLUGIN_TIMEOUT) or REMEMBER_SECONDS passing tries
again; in-process plugins (tests, embedding code) never are. The memory
is a small JSON file in the download cache directory; one that cannot be read or written is no memory at all.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..base.atomic import atomic_write_text
from ..base.errors import EemicrogptError
from ..data.datafile import cache_dir

MEMORY_NAME = "hung-plugins.json"
REMEMBER_SECONDS = 24 * 3600


def memory_path() -> Path:
    return cache_dir() / MEMORY_NAME


def key(distribution: str, version: str, what: str) -> str | None:
    """The memory's key for a call, or None for what is never remembered (no installed distribution)."""
    return f"{distribution} {version}: {what}" if version else None


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recall(call_key: str | None, limit: float, now: float | None = None) -> str | None:
    """The error to report instead of calling again, when this call missed a deadline of at least `limit`
    seconds within REMEMBER_SECONDS."""
    if call_key is None:
        return None
    try:
        path = memory_path()
    except EemicrogptError:
        return None
    entry = _load(path).get(call_key)
    if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)):
        return None
    if not isinstance(entry.get("limit"), (int, float)) or limit > entry["limit"]:
        return None  # given more time now than it had then: try again
    age = (time.time() if now is None else now) - entry["at"]
    if not 0 <= age < REMEMBER_SECONDS:
        return None
    return (f"{entry.get('error', 'hung')} {age / 3600:.1f} h ago; not tried again for "
            f"{(REMEMBER_SECONDS - age) / 3600:.1f} h (delete {path} to try now)")


def remember(call_key: str | None, error: str, limit: float, now: float | None = None) -> None:
    if call_key is None:
        return
    try:
        path = memory_path()
        data = _load(path)
        stamp = time.time() if now is None else now
        data = {k: v for k, v in data.items()
                if isinstance(v, dict) and isinstance(v.get("at"), (int, float)) and stamp - v["at"] < REMEMBER_SECONDS}
        data[call_key] = {"error": error, "at": stamp, "limit": limit}
        atomic_write_text(path, json.dumps(data, indent=1))
    except (OSError, EemicrogptError):
        pass  # no memory: the next command waits for the deadline again
