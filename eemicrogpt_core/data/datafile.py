"""Where the data file comes from: a user path, an environment variable, or a default file cached once.

Each data format has its default: lists (`lines`) makemore's names.txt, found through $EEMICROGPT_DATA;
texts (`text`) char-rnn's tiny Shakespeare, found through $EEMICROGPT_TEXT_DATA. Both are downloaded once
and checked against their sha256.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class DefaultFile:
    """The file a data format trains on when the user names none."""

    filename: str  # in the download cache
    url: str
    sha256: str
    env_var: str  # names a file of this format instead
    what: str  # in messages


NAMES = DefaultFile("names.txt", DEFAULT_URL, DEFAULT_SHA256, ENV_VAR, "names file")
TEXT_ENV_VAR = "EEMICROGPT_TEXT_DATA"
SHAKESPEARE = DefaultFile(
    "tinyshakespeare.txt", "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", TEXT_ENV_VAR, "text file")
DEFAULTS = {"lines": NAMES, "text": SHAKESPEARE}  # by config.data_format


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    override = env.get(CACHE_ENV_VAR)
    return user_path(override, f"${CACHE_ENV_VAR}") if override else platformdirs.user_cache_path("eemicrogpt")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def urllib_fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def fetch_verified(
    dest: Path, url: str = DEFAULT_URL, sha256: str = DEFAULT_SHA256, fetch: Fetcher | None = None,
    default: DefaultFile = NAMES,
) -> Path:
    """Return dest once it holds the file with this sha256, downloading it if it is missing or stale (`default`
    says what the file is in messages)."""
    what, env_var = default.what, default.env_var
    if dest.is_file() and sha256_of(dest.read_bytes()) == sha256:
        return dest
    try:
        data = (fetch or urllib_fetch)(url)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(
            f"cannot download the default {what} from {url} ({reason}); "
            f"pass a {what} with --data PATH or set {env_var}=PATH"
        ) from None
    got = sha256_of(data)
    if got != sha256:
        raise DataError(
            f"downloaded {url} has sha256 {got}, expected {sha256}; refusing to use it "
            f"(pass a {what} with --data PATH or set {env_var}=PATH)"
        )
    try:
        atomic_write_bytes(dest, data)
    except OSError as e:
        raise DataError(describe_os_error(e, "cannot write the download cache") +
                        f" (or set {CACHE_ENV_VAR} to a writable directory, or pass --data PATH)") from None
    return dest


def cached_names_file(env: Mapping[str, str] = os.environ) -> Path | None:
    """The makemore names.txt in the download cache when it is there and verifies, else None."""
    return cached_file(NAMES, env)


def cached_file(default: DefaultFile, env: Mapping[str, str] = os.environ) -> Path | None:
    """A default file in the download cache when it is there and verifies, else None."""
    cached = cache_dir(env) / default.filename
    try:
        return cached if sha256_of(cached.read_bytes()) == default.sha256 else None
    except OSError:
        return None


def find_names_file(
    extra: Iterable[Path] = (), env: Mapping[str, str] = os.environ
) -> tuple[Path | None, str]:
    """A names file that is here without downloading, and where else one was looked for (find_default_file)."""
    return find_default_file(NAMES, extra, env)


def find_default_file(
    default: DefaultFile, extra: Iterable[Path] = (), env: Mapping[str, str] = os.environ
) -> tuple[Path | None, str]:
    """A file of `default`'s kind that is here without downloading, and where else one was looked for.

    Order: its variable (if set, it is the answer even when missing, so a typo is not papered over), then
    `extra` (e.g. a checkout's shared copy), then the verified download cache.
    Returns (path or None, a one-line hint on how to provide the file).
    """
    var = default.env_var
    if env.get(var):
        return Path(env[var]).expanduser(), f"{var} is set"
    looked = [str(p) for p in extra]
    for candidate in extra:
        if candidate.is_file():
            return candidate, ""
    cached = cached_file(default, env)
    if cached is not None:
        return cached, ""
    looked.append(str(cache_dir(env) / default.filename))
    hint = (
        f"no {default.what} found (looked in {', '.join(looked)}): set {var}=/path/to/{default.filename} "
        f"({default.url.rsplit('/', 1)[-1]} of {default.url}, sha256 {default.sha256[:12]}...), or run "
        "`eemicrogpt train` once online to download it to the cache"
    )
    return None, hint


def resolve_data_path(
    flag: str | None,
    config_value: str | None,
    *,
    env: Mapping[str, str] = os.environ,
    fetch: Fetcher | None = None,
    data_format: str = "lines",
) -> Path:
    """--data flag > the format's variable ($EEMICROGPT_DATA, $EEMICROGPT_TEXT_DATA) > the config's data key >
    the format's default file, cached (makemore's names.txt, char-rnn's tiny Shakespeare)."""
    default = DEFAULTS[data_format]
    return given_data_path(flag, config_value, env=env, data_format=data_format) or fetch_verified(
        cache_dir(env) / default.filename, default.url, default.sha256, fetch=fetch, default=default)


def given_data_path(flag: str | None, config_value: str | None, *, env: Mapping[str, str] = os.environ,
                    data_format: str = "lines") -> Path | None:
    """The data file the user named (--data flag > the format's variable > the config's data key), or None when
    the format's cached default file applies."""
    var = DEFAULTS[data_format].env_var
    for chosen, what in ((flag, "--data"), (env.get(var), f"${var}"), (config_value, "data")):
        if chosen:
            return user_path(chosen, what)
    return None
