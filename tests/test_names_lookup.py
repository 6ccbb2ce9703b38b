"""Finding the names file without a download: the order the program and the tests share, and the hint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eemicrogpt_core.data import datafile
from eemicrogpt_core.data.datafile import CACHE_ENV_VAR, DEFAULT_SHA256, ENV_VAR, find_names_file


def test_env_var_wins_even_when_its_file_is_missing(tmp_path: Path) -> None:
    beside = tmp_path / "beside.txt"
    beside.write_text("anna\n")
    path, hint = find_names_file([beside], env={ENV_VAR: str(tmp_path / "typo.txt")})
    assert path == tmp_path / "typo.txt"
    assert ENV_VAR in hint


def test_first_existing_candidate_then_cache(tmp_path: Path) -> None:
    present = tmp_path / "present.txt"
    present.write_text("anna\n")
    env = {CACHE_ENV_VAR: str(tmp_path / "cache")}
    assert find_names_file([tmp_path / "absent.txt", present], env=env)[0] == present


def test_cache_counts_only_when_it_verifies(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "names.txt").write_text("not makemore\n")
    env = {CACHE_ENV_VAR: str(cache)}
    path, hint = find_names_file([tmp_path / "absent.txt"], env=env)
    assert path is None
    assert "\n" not in hint
    for fragment in (ENV_VAR, str(tmp_path / "absent.txt"), str(cache / "names.txt"), DEFAULT_SHA256[:12]):
        assert fragment in hint


def test_verified_cache_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "names.txt").write_bytes(b"anna\nbob\n")
    verified = dataclasses.replace(datafile.NAMES, sha256=datafile.sha256_of(b"anna\nbob\n"))
    monkeypatch.setattr(datafile, "NAMES", verified)
    path, _ = find_names_file([tmp_path / "absent.txt"], env={CACHE_ENV_VAR: str(cache)})
    assert path == cache / "names.txt"
