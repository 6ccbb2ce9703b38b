"""Where the names file comes from: a user path, $EEMICROGPT_DATA, or the makemore file cached once."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import platformdirs

from ..base.atomic import atomic_write_bytes
from ..base.errors import DataError, describe_os_error
from ..base.paths import user_path

DEFAULT_URL = "https://raw.githubusercontent.com/karpathy/makemore/master/names.txt"
DEFAULT_SHA256 = "0a30b5557f192f32ab962680889aac5f6fda0f4cecf40a6d0b5694f58ea8cc4d"
ENV_VAR = "EEMICROGPT_DATA"
CACHE_ENV_VAR = "EEMICROGPT_CACHE_DIR"  # lets tests and CI keep the cache out of the home directory

Fetcher = Callable[[str], bytes]


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    override = env.get(CACHE_ENV_VAR)
    return user_path(override, f"${CACHE_ENV_VAR}") if override else platformdirs.user_cache_path("eemicrogpt")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def urllib_fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def fetch_verified(
    dest: Path, url: str = DEFAULT_URL, sha256: str = DEFAULT_SHA256, fetch: Fetcher | None = None
) -> Path:
    """Return dest once it holds the file with this sha256, downloading it if it is missing or stale."""
    if dest.is_file() and sha256_of(dest.read_bytes()) == sha256:
        return dest
    try:
        data = (fetch or urllib_fetch)(url)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(
            f"cannot download the default names file from {url} ({reason}); "
            f"pass a names file with --data PATH or set {ENV_VAR}=PATH"
        ) from None
    got = sha256_of(data)
    if got != sha256:
        raise DataError(
            f"downloaded {url} has sha256 {got}, expected {sha256}; refusing to use it "
            f"(pass a names file with --data PATH or set {ENV_VAR}=PATH)"
        )
    try:
        atomic_write_bytes(dest, data)
    except OSError as e:
        raise DataError(describe_os_error(e, "cannot write the download cache") +
                        f" (or set {CACHE_ENV_VAR} to a writable directory, or pass --data PATH)") from None
    return dest


def cached_names_file(env: Mapping[str, str] = os.environ) -> Path | None:
    """The makemore names.txt in the download cache when it is there and verifies, else None."""
    cached = cache_dir(env) / "names.txt"
    try:
        return cached if sha256_of(cached.read_bytes()) == DEFAULT_SHA256 else None
    except OSError:
        return None


def find_names_file(
    extra: Iterable[Path] = (), env: Mapping[str, str] = os.environ
) -> tuple[Path | None, str]:
    """A names file that is here without downloading, and where else one was looked for.

    Order: $EEMICROGPT_DATA (if set, it is the answer even when missing, so a typo is not papered over),
    then `extra` (e.g. a checkout's shared copy), then the verified download cache.
    Returns (path or None, a one-line hint on how to provide the file).
    """
    if env.get(ENV_VAR):
        return Path(env[ENV_VAR]).expanduser(), f"{ENV_VAR} is set"
    looked = [str(p) for p in extra]
    for candidate in extra:
        if candidate.is_file():
            return candidate, ""
    cached = cached_names_file(env)
    if cached is not None:
        return cached, ""
    looked.append(str(cache_dir(env) / "names.txt"))
    hint = (
        f"no names file found (looked in {', '.join(looked)}): set {ENV_VAR}=/path/to/names.txt "
        f"(makemore's names.txt, sha256 {DEFAULT_SHA256[:12]}...), or run `eemicrogpt train` once online "
        "to download it to the cache"
    )
    return None, hint


def resolve_data_path(
    flag: str | None,
    config_value: str | None,
    *,
    env: Mapping[str, str] = os.environ,
    fetch: Fetcher | None = None,
) -> Path:
    """--data flag > $EEMICROGPT_DATA > the config's data key > the cached makemore names.txt."""
    return given_data_path(flag, config_value, env=env) or fetch_verified(cache_dir(env) / "names.txt", fetch=fetch)


def given_data_path(flag: str | None, config_value: str | None, *, env: Mapping[str, str] = os.environ) -> Path | None:
    """The names file the user named (--data flag > $EEMICROGPT_DATA > the config's data key), or None when the
    cached makemore names.txt applies."""
    for chosen, what in ((flag, "--data"), (env.get(ENV_VAR), f"${ENV_VAR}"), (config_value, "data")):
        if chosen:
            return user_path(chosen, what)
    return None
