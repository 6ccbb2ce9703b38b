"""Every hook in the spec is documented and exercised by some test (as datasette checks its hooks)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from eemicrogpt_core.backends import hookspec

HOOKS = [
    name for name, fn in inspect.getmembers(hookspec, inspect.isfunction)
    if hasattr(fn, f"{hookspec.PROJECT}_spec")
]
REPO = Path(__file__).resolve().parents[1]


def test_the_spec_has_hooks() -> None:
    assert "eemicrogpt_backends" in HOOKS and "eemicrogpt_fp32_peak_gflops" in HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspec, hook)) or ""
    assert len(doc.split()) >= 10, f"{hook} needs a docstring saying what a plugin returns"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_implemented_and_tested_somewhere(hook: str) -> None:
    tests = [*REPO.glob("tests/test_*.py"), *REPO.glob("backends/*/tests/test_*.py")]
    assert any(hook in path.read_text() for path in tests if path.name != "test_hookspec.py"), hook
