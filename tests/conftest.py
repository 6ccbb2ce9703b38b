"""Shared fixtures. The names file is never in the repository: it is found as the program finds it
($EEMICROGPT_DATA, ../shared/data/names.txt beside a checkout, the verified download cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eemicrogpt_core import testing
from eemicrogpt_core.registry import BackendRegistry, load_registry

# pytester runs generated subclasses of the conformance kit (tests/test_conformance_kit.py).
pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def names_file() -> Path:
    return testing.names_file()


@pytest.fixture(scope="module")
def registry() -> BackendRegistry:
    """The installed backends; numpy_ref among them (the tests that train use it)."""
    reg = load_registry()
    entry = reg.get("numpy_ref")
    if entry is None or not entry.available:
        pytest.fail("numpy_ref must be installed for these tests: pip install ./backends/numpy_ref", pytrace=False)
    return reg
