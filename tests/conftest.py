"""Shared fixtures. The names file lives outside the repository: ../shared/data/names.txt from its root."""

from __future__ import annotations

from pathlib import Path

import pytest

# pytester runs generated subclasses of the conformance kit (tests/test_conformance_kit.py).
pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMES_FILE = REPO_ROOT.parent / "shared" / "data" / "names.txt"


@pytest.fixture(scope="session")
def names_file() -> Path:
    if not NAMES_FILE.is_file():
        pytest.fail(f"test data missing: {NAMES_FILE} (the makemore names.txt)", pytrace=False)
    return NAMES_FILE
