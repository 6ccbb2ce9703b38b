"""Shared fixtures. The names file is never in the repository: it is found as the program finds it
($EEMICROGPT_DATA, ../shared/data/names.txt beside a checkout, the verified download cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eemicrogpt_core import testing

# pytester runs generated subclasses of the conformance kit (tests/test_conformance_kit.py).
pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def names_file() -> Path:
    return testing.names_file()
