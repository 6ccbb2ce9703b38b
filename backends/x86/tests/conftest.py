"""Shared fixtures for the x86 backend tests: the variants this machine can run, opened through the ABI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference64 helpers

from eemicrogpt_backend_x86.libs import library_path
from eemicrogpt_backend_x86.probe import probe

VARIANT_NAMES = ("avx512", "avx2")


@pytest.fixture(params=VARIANT_NAMES)
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each variant's name; skipped with the probe's reason where the CPU cannot run it."""
    monkeypatch.delenv("EEMICROGPT_X86_DISABLE", raising=False)
    result = probe(request.param)
    if not result.available:
        pytest.skip(result.reason)
    return request.param


@pytest.fixture
def lib_path(variant: str) -> str:
    path = library_path(variant)
    assert path is not None
    return str(path)
