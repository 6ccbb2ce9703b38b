"""The default names file: download once, verify sha256, write atomically; overrides; offline errors.

Nothing here touches the network: downloads come from file:// URLs or a fake fetcher.
"""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path

import pytest

from eemicrogpt_core.base.errors import DataError
from eemicrogpt_core.data import datafile
from eemicrogpt_core.data.datafile import fetch_verified, resolve_data_path

CONTENT = b"emma\nolivia\nava\n"
SHA = hashlib.sha256(CONTENT).hexdigest()


def test_file_url_download_is_verified_and_cached(tmp_path: Path) -> None:
    source = tmp_path / "src.txt"
    source.write_bytes(CONTENT)
    dest = tmp_path / "cache" / "names.txt"
    assert fetch_verified(dest, source.as_uri(), SHA) == dest
    assert dest.read_bytes() == CONTENT
    source.unlink()  # a second call must use the cache, not the URL
    assert fetch_verified(dest, source.as_uri(), SHA).read_bytes() == CONTENT
    assert [p.name for p in dest.parent.iterdir()] == ["names.txt"]  # no temp files left behind


def test_sha_mismatch_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "names.txt"
    with pytest.raises(DataError, match=r"has sha256 .* expected"):
        fetch_verified(dest, "https://example.invalid/names.txt", SHA, fetch=lambda url: b"tampered\n")
    assert not dest.exists()


def test_stale_cache_is_downloaded_again(tmp_path: Path) -> None:
    dest = tmp_path / "names.txt"
    dest.write_bytes(b"half a fi")
    calls = []

    def fetch(url: str) -> bytes:
        calls.append(url)
        return CONTENT

    fetch_verified(dest, "https://example.invalid/n", SHA, fetch=fetch)
    assert calls and dest.read_bytes() == CONTENT


def test_offline_error_says_how_to_pass_a_file(tmp_path: Path) -> None:
    def offline(url: str) -> bytes:
        raise urllib.error.URLError("Temporary failure in name resolution")

    with pytest.raises(DataError, match=r"cannot download .*--data PATH.*EEMICROGPT_DATA"):
        fetch_verified(tmp_path / "names.txt", datafile.DEFAULT_URL, datafile.DEFAULT_SHA256, fetch=offline)


def test_missing_file_url_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot download"):
        fetch_verified(tmp_path / "names.txt", (tmp_path / "absent.txt").as_uri(), SHA)


def test_precedence_flag_env_config_default(tmp_path: Path) -> None:
    env = {datafile.ENV_VAR: "/env/names.txt", datafile.CACHE_ENV_VAR: str(tmp_path)}

    def never(url: str) -> bytes:
        raise AssertionError("must not download when a path was given")

    assert resolve_data_path("/flag.txt", "/cfg.txt", env=env, fetch=never) == Path("/flag.txt")
    assert resolve_data_path(None, "/cfg.txt", env=env, fetch=never) == Path("/env/names.txt")
    assert resolve_data_path(None, "/cfg.txt", env={}, fetch=never) == Path("/cfg.txt")


def test_default_goes_to_the_cache_dir(tmp_path: Path) -> None:
    env = {datafile.CACHE_ENV_VAR: str(tmp_path / "cache")}
    fetched: list[str] = []

    def fake(url: str) -> bytes:
        fetched.append(url)
        return CONTENT

    path = datafile.fetch_verified(datafile.cache_dir(env) / "names.txt", datafile.DEFAULT_URL, SHA, fetch=fake)
    assert path == tmp_path / "cache" / "names.txt" and path.read_bytes() == CONTENT
    assert fetched == [datafile.DEFAULT_URL]


def test_resolve_without_anything_downloads_the_default(tmp_path: Path) -> None:
    env = {datafile.CACHE_ENV_VAR: str(tmp_path)}
    with pytest.raises(DataError, match="has sha256"):  # the fake content is not makemore's names.txt
        resolve_data_path(None, None, env=env, fetch=lambda url: CONTENT)
